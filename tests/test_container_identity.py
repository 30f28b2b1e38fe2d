"""Container identity from /proc/<pid>/cgroup and mountinfo, over the fixtures in
tests/data/proc/<case>/{cgroup,mountinfo}. Each fixture's first line says whether it was captured
on the development machine (Docker 20.10, cgroup v1, cgroupfs driver) or transcribed from a
runtime's documented naming; the table below is what each must resolve to."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from servewitness.evidence.container import (
    RUNTIMES,
    ContainerRef,
    container_from_cgroup,
    container_from_mountinfo,
    container_id_from_cgroup,
    resolve_container,
)

PROC = Path(__file__).parent / "data" / "proc"

# case: (id, runtime, source, pod_uid), or None where the case names no container.
Expected = tuple[str, str, str, str | None] | None
CASES: dict[str, Expected] = {
    # -- captured on this machine --
    "docker_v1_cgroupfs": (
        "b6f7aeffa0f631af55e94326826efc8105f980bb6c64ecef604a631a7606307a",
        "docker",
        "cgroup",
        None,
    ),
    "docker_v1_cgroupns_private": (  # cgroup file is all "/": only the mount table names it
        "d5db9b8d77d09e4647077ba85c2db7dcee421d63c129c12f901f4be1caad93c0",
        "docker",
        "mountinfo",
        None,
    ),
    "docker_shared_netns_cgroup_wins": (  # cgroup names B, mountinfo names A: B, from cgroup
        "d02a8f1f8bfbcdb8fe69c324c14bb73cbc167e57cc8ab81f7fe258ff9cb8e86d",
        "docker",
        "cgroup",
        None,
    ),
    "docker_shared_netns_cgroupns_private": (  # the fallback's documented limit: it names A
        "38ea1e3febbc7a143e2704356f62754b283d08ce7d7b0e305837ef5f3a82283f",
        "docker",
        "mountinfo",
        None,
    ),
    "containerd_ctr_v1": (
        "8424fd7fd398b64206847c4d16ae2065fd18119d5455f4d1bff02d3dbe0de827",
        "containerd",
        "cgroup",
        None,
    ),
    "agent_private_cgroupns_reads_other_v1": (  # /../<id>: the /docker parent is not visible
        "6ae5c95fcd84c502b859f33b9bbfa64753e7b9d534e07ac7165445a30ad72bb5",
        "unknown",
        "cgroup",
        None,
    ),
    "host_this_machine": None,
    "cgroup_v2_root_host_mountinfo": None,
    # -- transcribed: Docker, containerd --
    "docker_in_docker_v1": (
        "25437081047c7971d2f51245b48f1164f706d9c60766dccb09958fc914ad08f1",
        "docker",
        "cgroup",
        None,
    ),
    "docker_systemd_v1": (
        "b2a2b14d35e1c79d1ff6491b33dd30d413e89f75d4fa7c5563bb348aa2a114a8",
        "docker",
        "cgroup",
        None,
    ),
    "docker_systemd_v2_host_cgroupns": (
        "69823f5d8fd37bb8807ad52e57d3d0b5d2c828e50131390b3ae2e24c67cb2a07",
        "docker",
        "cgroup",
        None,
    ),
    "docker_v2_private_dataroot_own_fs": (
        "706db0c921a72e6f094d85b19ca5ab51e9fc8bd8d1709e31bbde2d21a6a39486",
        "docker",
        "mountinfo",
        None,
    ),
    "nerdctl_systemd_v2": (
        "aa470170773aae4a69e6e0a509eb8c1f304140b1fea1a2d55ec93a07a78e497c",
        "containerd",
        "cgroup",
        None,
    ),
    # -- transcribed: Kubernetes --
    "k8s_containerd_systemd_v2_burstable": (
        "9a8e2d63cf1072a0c0dc8b64f2a76717a991ab991f01e84d3aa7475b0fab7b72",
        "containerd",
        "cgroup",
        "96e4b78e-a12d-9e49-86a8-5044191e3fcc",
    ),
    "k8s_cgroupfs_v1_besteffort": (
        "a975d3a8f975d724de3feac9e6da4aeaaaffc43781ae8060795b7f7558e21d71",
        "unknown",
        "cgroup",
        "4729304c-4030-ae53-1052-14d4e9d21f8b",
    ),
    "k8s_cgroupfs_v1_guaranteed_subcgroup": (
        "1e8b439e53006e85d455c0e9bbcc5266f62c5e99ba23e881e3f1a1f26bad544d",
        "unknown",
        "cgroup",
        "e011f2f0-c94d-c1c8-e232-f3663914d4df",
    ),
    "k8s_crio_systemd_v2_guaranteed": (
        "f27036b5fe52747db923e711dd9c5bae511ae78e641e27a946c31ee0d0480c41",
        "cri-o",
        "cgroup",
        "60ef181f-f6ac-0ef0-8e6a-f794e7444f33",
    ),
    "k8s_crio_crun_container_subcgroup_v2": (
        "943d7c533758b6a54bce995574db15b815f2046e31a9305c0641758db72ec638",
        "cri-o",
        "cgroup",
        "b46ffd44-9487-47bc-b9c4-27ecc08ac3de",
    ),
    "k8s_kind_node_v1_cgroupfs": (
        "3eeefe3fc4e6df94f54bb2c8abdc91d29a77c43076c81ea2331ab1456e8a00b2",
        "unknown",
        "cgroup",
        "cb1d31b8-4469-8eac-b9b0-156cc548708d",
    ),
    "k8s_dockershim_systemd_v1": (
        "a8dc47c3a9abf70f452b6663ee8d663ac58124ea71e42ac56263b01186c4cfca",
        "docker",
        "cgroup",
        "a0418cd1-b13b-8b14-b19c-0e76919bf171",
    ),
    "k8s_static_pod_v2": (
        "a8a820fbada81c53d65a0c50e0f2a499f0edd10f42e4e1b28784619f74d0452f",
        "containerd",
        "cgroup",
        "39f01702e399c2e7446bb362a3c3454b",
    ),
    "containerd_systemd_colon_form_v2": (
        "e07ab46f8e7f87317b4545f59af5327a1d39048df93785c504f3ea76443df7f4",
        "containerd",
        "cgroup",
        "3fde3023-b162-eded-dbf0-2d9de32d1ba9",
    ),
    "cgroupns_relative_pod_v1": (
        "bdfeffd6b8c680ce5cc5916be77db79041a6420affb2ca988088219be0924ecb",
        "unknown",
        "cgroup",
        "24853a3b-7550-abe5-8534-769b2116d370",
    ),
    "cgroupns_relative_crio_v2": (
        "715b62dda9f649c80eafc37730850bf975afa8b7bee8a646fa89a9cf86378b86",
        "cri-o",
        "cgroup",
        None,
    ),
    "crio_conmon_systemd_v2": None,  # the monitor, not the container
    "crio_conmon_in_docker_node_v1": (  # the monitor is in the node container, not the pod's
        "0b028a7a1eaa875b35c70a6b6455463ab63e34d7b3319f341021ee409468567a",
        "docker",
        "cgroup",
        None,
    ),
    "k8s_containerd_v2_private_mountinfo_sandbox": None,  # names the pod sandbox only
    "k8s_dockershim_private_mountinfo_sandbox": None,  # names the pause container only
    # -- transcribed: Podman --
    "podman_systemd_v2_rootful": (
        "4675a9ec2d20c5f97577a55c245da887778bcdf5e64fdb01cfa074c86f6754a5",
        "podman",
        "cgroup",
        None,
    ),
    "podman_rootless_v2_user_slice": (
        "56dfa3bc944415a972b0fe05883435f6f061150cc65600d923a24fd565932362",
        "podman",
        "cgroup",
        None,
    ),
    "podman_cgroupfs_v1": (
        "53524afa757bb9c4b03c7d93dbb7028703f61cb1c5085dd3028933f3525f1358",
        "podman",
        "cgroup",
        None,
    ),
    "podman_conmon_v2": None,
    "podman_rootless_private_cgroupns_containerenv": (
        "32e08669e70bf819b7ed15878e24432848fde49ab23eb4edbe5a091e2f6502ce",
        "podman",
        "mountinfo",
        None,
    ),
    # -- hosts and garbage --
    "host_init_scope_v2": None,
    "host_user_session_v1": None,
    "host_k8s_node_v2": None,
    "overlay_layer_ids_only": None,
    "garbage": None,
    "cgroup_conflicting_ids": None,  # and the mount table's third id is not taken either
}


def _read(case: str, name: str) -> str | None:
    path = PROC / case / name
    return path.read_text() if path.exists() else None


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixture_resolves_to_its_container(case: str) -> None:
    got = resolve_container(_read(case, "cgroup"), _read(case, "mountinfo"))
    expected = CASES[case]
    if expected is None:
        assert got is None
        return
    assert got == ContainerRef(*expected)
    assert got.runtime in RUNTIMES


def test_every_fixture_is_in_the_table_and_says_where_it_came_from() -> None:
    on_disk = {p.name for p in PROC.iterdir() if p.is_dir()}
    assert on_disk == set(CASES)
    for case in on_disk:
        files = sorted((PROC / case).iterdir())
        assert files, case
        for f in files:
            first = f.read_text().splitlines()[0]
            assert first.startswith("#"), f
            assert any(
                w in first for w in ("captured on this machine", "transcribed", "written by hand")
            ), f


def test_captured_docker_cgroup_and_mountinfo_agree() -> None:
    """On a plain Docker container (captured) both witnesses name the same container: the
    fallback reads the real format right, not just the transcribed one."""
    cgroup = _read("docker_v1_cgroupfs", "cgroup")
    mountinfo = _read("docker_v1_cgroupfs", "mountinfo")
    assert cgroup is not None and mountinfo is not None
    by_cgroup = container_from_cgroup(cgroup)
    by_mounts = container_from_mountinfo(mountinfo)
    assert by_cgroup is not None and by_mounts is not None
    assert (by_cgroup.id, by_cgroup.source) == (by_mounts.id, "cgroup")
    assert by_mounts.source == "mountinfo"


def test_fallback_is_taken_only_when_the_cgroup_names_nothing() -> None:
    mountinfo = _read("docker_v1_cgroupns_private", "mountinfo")
    assert mountinfo is not None
    via_mounts = resolve_container("0::/\n", mountinfo)
    assert via_mounts is not None and via_mounts.source == "mountinfo"
    assert resolve_container(None, mountinfo) == via_mounts  # cgroup file unreadable
    assert resolve_container(None, None) is None
    assert resolve_container("0::/\n", None) is None
    own = "1" * 64
    assert resolve_container(f"0::/docker/{own}\n", mountinfo) == ContainerRef(
        own, "docker", "cgroup"
    )


def test_container_id_from_cgroup_keeps_its_contract() -> None:
    """The old entry point (collect.py) answers the id, or None, from the same parser."""
    cgroup = _read("docker_v1_cgroupfs", "cgroup")
    assert cgroup is not None
    assert container_id_from_cgroup(cgroup) == (
        "b6f7aeffa0f631af55e94326826efc8105f980bb6c64ecef604a631a7606307a"
    )
    assert container_id_from_cgroup("0::/init.scope\n") is None
    assert container_id_from_cgroup(f"0::/system.slice/crio-conmon-{'2' * 64}.scope\n") is None


@pytest.mark.parametrize(
    ("root", "point"),
    [
        (r"/mnt/big\040disk/docker/containers/{id}/hostname", "/etc/hostname"),
        (r"/var/lib/docker/containers/{id}/hosts", r"/etc/hosts"),
    ],
)
def test_mountinfo_fields_are_unescaped(root: str, point: str) -> None:
    cid = "3" * 64
    line = f"90 72 254:0 {root.format(id=cid)} {point} rw,relatime - ext4 /dev/vda rw\n"
    assert container_from_mountinfo(line) == ContainerRef(cid, "docker", "mountinfo")


def test_mountinfo_ignores_container_files_bound_elsewhere() -> None:
    """Only the per-container files at their own mount points count: a container's hostname
    file bound at /data/hostname (or a host that mounts them for inspection) names nothing."""
    cid = "4" * 64
    line = f"90 72 254:0 /var/lib/docker/containers/{cid}/hostname /data/hostname rw - ext4 x rw\n"
    assert container_from_mountinfo(line) is None


def test_no_input_makes_it_raise() -> None:
    """Arbitrary text (here: 2000 deterministic pseudo-random byte strings, decoded as latin-1 so
    every byte value, NUL and newlines included, appears) never raises."""
    seed = b"container-identity"
    for i in range(2000):
        seed = hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
        text = (seed * (1 + i % 7)).decode("latin-1")
        for candidate in (text, "0::/" + text, "1 2 3:4 / " + text + " - x y z"):
            container_from_cgroup(candidate)
            container_from_mountinfo(candidate)
            resolve_container(candidate, candidate)
    assert container_from_cgroup("") is None
    assert container_from_mountinfo("") is None


@pytest.mark.parametrize(
    "kubelet_root",
    [
        "/var/lib/kubelet/pods/0f2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b/etc-hosts",
        "/pods/0f2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b/etc-hosts",  # /var/lib/kubelet on its own fs
    ],
)
def test_a_pods_docker_files_name_its_sandbox_not_the_container(kubelet_root: str) -> None:
    """Under Kubernetes the Docker-looking hostname file is the pause container's."""
    sandbox = "5" * 64
    text = (
        f"673 659 254:1 {kubelet_root} /etc/hosts rw - ext4 /dev/vda1 rw\n"
        f"676 659 254:1 /var/lib/docker/containers/{sandbox}/hostname /etc/hostname rw - ext4 x y"
    )
    assert container_from_mountinfo(text) is None
    assert container_from_mountinfo(text.splitlines()[1]) == ContainerRef(
        sandbox, "docker", "mountinfo"
    )
