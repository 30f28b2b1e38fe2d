"""Device diagnostic: what /proc/<pid>/environ holds for each process of the vLLM tree."""
import json, os, sys
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.judge import started_environment
from servewitness.evidence import origins
fs = ProcFS()
root = int(sys.argv[1])
pids = [root]
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            st = open(f"/proc/{d}/stat").read()
            ppid = int(st.rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid in pids or ppid == root:
            pids.append(int(d))
for pid in sorted(set(pids)):
    out = {"pid": pid}
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
        out.update(len=len(raw), nonzero=len(raw.replace(b"\0", b"")), head=raw[:120].decode("latin1"),
                   has_home=b"HOME=" in raw, has_path=b"PATH=" in raw)
    except OSError as e:
        out["environ_error"] = repr(e)
    try:
        out["cmdline"] = open(f"/proc/{pid}/cmdline", "rb").read()[:80].decode("latin1")
        out["nsl"] = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError as e:
        out["other_error"] = repr(e)
    try:
        out["pid_ns"] = fs.pid_ns(pid)
        out["ppid"] = fs.identity(pid).ppid
        env = started_environment(fs, pid)
        out["started_env_keys"] = len(env)
        out["generated"] = origins.generated_dirs(env)
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    print(json.dumps(out))
