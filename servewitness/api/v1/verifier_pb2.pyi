from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_PASS: _ClassVar[Verdict]
    VERDICT_FAIL: _ClassVar[Verdict]
    VERDICT_PENDING: _ClassVar[Verdict]
    VERDICT_STALE: _ClassVar[Verdict]

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_ERROR: _ClassVar[Severity]
    SEVERITY_PENDING: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_INFO: _ClassVar[Severity]
VERDICT_UNSPECIFIED: Verdict
VERDICT_PASS: Verdict
VERDICT_FAIL: Verdict
VERDICT_PENDING: Verdict
VERDICT_STALE: Verdict
SEVERITY_UNSPECIFIED: Severity
SEVERITY_ERROR: Severity
SEVERITY_PENDING: Severity
SEVERITY_WARNING: Severity
SEVERITY_INFO: Severity

class ProcessKey(_message.Message):
    __slots__ = ("boot_id", "pid", "start_ticks")
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TICKS_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    pid: int
    start_ticks: int
    def __init__(self, boot_id: _Optional[str] = ..., pid: _Optional[int] = ..., start_ticks: _Optional[int] = ...) -> None: ...

class RunnerEvidence(_message.Message):
    __slots__ = ("cls", "file", "sha256", "mro")
    CLS_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    MRO_FIELD_NUMBER: _ClassVar[int]
    cls: str
    file: str
    sha256: str
    mro: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cls: _Optional[str] = ..., file: _Optional[str] = ..., sha256: _Optional[str] = ..., mro: _Optional[_Iterable[str]] = ...) -> None: ...

class StepEvidence(_message.Message):
    __slots__ = ("total", "productive", "empty", "tokens_scheduled", "requests_scheduled", "requests_max", "last_step_unix_ns", "prefill_steps", "decode_steps", "prefill_tokens", "decode_tokens", "dummy_steps", "compilation_mode", "cudagraph_mode", "enforce_eager", "spec", "raised")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PRODUCTIVE_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_MAX_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DUMMY_STEPS_FIELD_NUMBER: _ClassVar[int]
    COMPILATION_MODE_FIELD_NUMBER: _ClassVar[int]
    CUDAGRAPH_MODE_FIELD_NUMBER: _ClassVar[int]
    ENFORCE_EAGER_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RAISED_FIELD_NUMBER: _ClassVar[int]
    total: int
    productive: int
    empty: int
    tokens_scheduled: int
    requests_scheduled: int
    requests_max: int
    last_step_unix_ns: int
    prefill_steps: int
    decode_steps: int
    prefill_tokens: int
    decode_tokens: int
    dummy_steps: int
    compilation_mode: str
    cudagraph_mode: str
    enforce_eager: bool
    spec: SpecEvidence
    raised: int
    def __init__(self, total: _Optional[int] = ..., productive: _Optional[int] = ..., empty: _Optional[int] = ..., tokens_scheduled: _Optional[int] = ..., requests_scheduled: _Optional[int] = ..., requests_max: _Optional[int] = ..., last_step_unix_ns: _Optional[int] = ..., prefill_steps: _Optional[int] = ..., decode_steps: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., decode_tokens: _Optional[int] = ..., dummy_steps: _Optional[int] = ..., compilation_mode: _Optional[str] = ..., cudagraph_mode: _Optional[str] = ..., enforce_eager: _Optional[bool] = ..., spec: _Optional[_Union[SpecEvidence, _Mapping]] = ..., raised: _Optional[int] = ...) -> None: ...

class SpecEvidence(_message.Message):
    __slots__ = ("on", "method", "num_speculative_tokens", "steps", "drafts", "draft_tokens", "accepted_tokens", "emitted_tokens", "unread_steps", "accepted_per_position")
    ON_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EMITTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNREAD_STEPS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    on: bool
    method: str
    num_speculative_tokens: int
    steps: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    emitted_tokens: int
    unread_steps: int
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, on: _Optional[bool] = ..., method: _Optional[str] = ..., num_speculative_tokens: _Optional[int] = ..., steps: _Optional[int] = ..., drafts: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., emitted_tokens: _Optional[int] = ..., unread_steps: _Optional[int] = ..., accepted_per_position: _Optional[_Iterable[int]] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("level", "logger", "message")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    LOGGER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    level: str
    logger: str
    message: str
    def __init__(self, level: _Optional[str] = ..., logger: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class HookEvidence(_message.Message):
    __slots__ = ("name", "target", "module_loaded", "wrapped", "owner", "how", "unresolved", "instantiated_class", "fired", "fired_productive", "first_step", "last_step", "fired_prefill", "fired_decode", "fired_outside", "device_fired", "device_base", "device_base_step", "source", "device")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MODULE_LOADED_FIELD_NUMBER: _ClassVar[int]
    WRAPPED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    HOW_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_FIELD_NUMBER: _ClassVar[int]
    INSTANTIATED_CLASS_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    FIRED_PRODUCTIVE_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    FIRED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    FIRED_DECODE_FIELD_NUMBER: _ClassVar[int]
    FIRED_OUTSIDE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIRED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BASE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BASE_STEP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    name: str
    target: str
    module_loaded: bool
    wrapped: bool
    owner: str
    how: str
    unresolved: str
    instantiated_class: str
    fired: int
    fired_productive: int
    first_step: int
    last_step: int
    fired_prefill: int
    fired_decode: int
    fired_outside: int
    device_fired: int
    device_base: int
    device_base_step: int
    source: str
    device: str
    def __init__(self, name: _Optional[str] = ..., target: _Optional[str] = ..., module_loaded: _Optional[bool] = ..., wrapped: _Optional[bool] = ..., owner: _Optional[str] = ..., how: _Optional[str] = ..., unresolved: _Optional[str] = ..., instantiated_class: _Optional[str] = ..., fired: _Optional[int] = ..., fired_productive: _Optional[int] = ..., first_step: _Optional[int] = ..., last_step: _Optional[int] = ..., fired_prefill: _Optional[int] = ..., fired_decode: _Optional[int] = ..., fired_outside: _Optional[int] = ..., device_fired: _Optional[int] = ..., device_base: _Optional[int] = ..., device_base_step: _Optional[int] = ..., source: _Optional[str] = ..., device: _Optional[str] = ...) -> None: ...

class FileEntry(_message.Message):
    __slots__ = ("path", "sha256", "size", "kind", "module", "at", "identity", "loaded")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256: str
    size: int
    kind: str
    module: str
    at: str
    identity: FileIdentity
    loaded: FileIdentity
    def __init__(self, path: _Optional[str] = ..., sha256: _Optional[str] = ..., size: _Optional[int] = ..., kind: _Optional[str] = ..., module: _Optional[str] = ..., at: _Optional[str] = ..., identity: _Optional[_Union[FileIdentity, _Mapping]] = ..., loaded: _Optional[_Union[FileIdentity, _Mapping]] = ...) -> None: ...

class FileIdentity(_message.Message):
    __slots__ = ("dev", "ino", "size", "mtime_ns", "ctime_ns")
    DEV_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    def __init__(self, dev: _Optional[int] = ..., ino: _Optional[int] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ...) -> None: ...

class ProcessReport(_message.Message):
    __slots__ = ("key", "ns_pid", "ppid", "start_time", "role", "rank", "container_id", "cmdline", "exe", "probe_present", "probe_errors", "runner", "steps", "hooks", "manifest_digest", "files_included", "files", "runner_file_sha256_now", "disagreements", "native_mappings", "provenance", "drift", "stack_witness", "runner_log", "roles", "evidence_problems", "code", "hashed_after", "hashed_after_count", "probe_started_ticks", "children")
    KEY_FIELD_NUMBER: _ClassVar[int]
    NS_PID_FIELD_NUMBER: _ClassVar[int]
    PPID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CMDLINE_FIELD_NUMBER: _ClassVar[int]
    EXE_FIELD_NUMBER: _ClassVar[int]
    PROBE_PRESENT_FIELD_NUMBER: _ClassVar[int]
    PROBE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    HOOKS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FILES_INCLUDED_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FILE_SHA256_NOW_FIELD_NUMBER: _ClassVar[int]
    DISAGREEMENTS_FIELD_NUMBER: _ClassVar[int]
    NATIVE_MAPPINGS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    STACK_WITNESS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_LOG_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    HASHED_AFTER_FIELD_NUMBER: _ClassVar[int]
    HASHED_AFTER_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROBE_STARTED_TICKS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    key: ProcessKey
    ns_pid: int
    ppid: int
    start_time: float
    role: str
    rank: int
    container_id: str
    cmdline: _containers.RepeatedScalarFieldContainer[str]
    exe: str
    probe_present: bool
    probe_errors: _containers.RepeatedScalarFieldContainer[str]
    runner: RunnerEvidence
    steps: StepEvidence
    hooks: _containers.RepeatedCompositeFieldContainer[HookEvidence]
    manifest_digest: str
    files_included: bool
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    runner_file_sha256_now: str
    disagreements: _containers.RepeatedCompositeFieldContainer[FileDisagreement]
    native_mappings: _containers.RepeatedCompositeFieldContainer[NativeMapping]
    provenance: Provenance
    drift: _containers.RepeatedCompositeFieldContainer[Drift]
    stack_witness: StackWitness
    runner_log: _containers.RepeatedCompositeFieldContainer[LogLine]
    roles: _containers.RepeatedScalarFieldContainer[str]
    evidence_problems: _containers.RepeatedCompositeFieldContainer[EvidenceProblem]
    code: _containers.RepeatedCompositeFieldContainer[CodeChain]
    hashed_after: _containers.RepeatedScalarFieldContainer[str]
    hashed_after_count: int
    probe_started_ticks: int
    children: ChildStarts
    def __init__(self, key: _Optional[_Union[ProcessKey, _Mapping]] = ..., ns_pid: _Optional[int] = ..., ppid: _Optional[int] = ..., start_time: _Optional[float] = ..., role: _Optional[str] = ..., rank: _Optional[int] = ..., container_id: _Optional[str] = ..., cmdline: _Optional[_Iterable[str]] = ..., exe: _Optional[str] = ..., probe_present: _Optional[bool] = ..., probe_errors: _Optional[_Iterable[str]] = ..., runner: _Optional[_Union[RunnerEvidence, _Mapping]] = ..., steps: _Optional[_Union[StepEvidence, _Mapping]] = ..., hooks: _Optional[_Iterable[_Union[HookEvidence, _Mapping]]] = ..., manifest_digest: _Optional[str] = ..., files_included: _Optional[bool] = ..., files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ..., runner_file_sha256_now: _Optional[str] = ..., disagreements: _Optional[_Iterable[_Union[FileDisagreement, _Mapping]]] = ..., native_mappings: _Optional[_Iterable[_Union[NativeMapping, _Mapping]]] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ..., drift: _Optional[_Iterable[_Union[Drift, _Mapping]]] = ..., stack_witness: _Optional[_Union[StackWitness, _Mapping]] = ..., runner_log: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., roles: _Optional[_Iterable[str]] = ..., evidence_problems: _Optional[_Iterable[_Union[EvidenceProblem, _Mapping]]] = ..., code: _Optional[_Iterable[_Union[CodeChain, _Mapping]]] = ..., hashed_after: _Optional[_Iterable[str]] = ..., hashed_after_count: _Optional[int] = ..., probe_started_ticks: _Optional[int] = ..., children: _Optional[_Union[ChildStarts, _Mapping]] = ...) -> None: ...

class EvidenceProblem(_message.Message):
    __slots__ = ("id", "detail")
    ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: str
    detail: str
    def __init__(self, id: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class CodeChain(_message.Message):
    __slots__ = ("subject", "via", "attr", "owner_module", "owner_qualname", "owner_file", "layers", "probe_layers", "changes", "recorded_unix", "python", "optimize", "status", "detail", "distribution")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    OWNER_MODULE_FIELD_NUMBER: _ClassVar[int]
    OWNER_QUALNAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FILE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    PROBE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    RECORDED_UNIX_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    subject: str
    via: str
    attr: str
    owner_module: str
    owner_qualname: str
    owner_file: str
    layers: _containers.RepeatedCompositeFieldContainer[CodeLayer]
    probe_layers: int
    changes: int
    recorded_unix: float
    python: str
    optimize: int
    status: str
    detail: str
    distribution: str
    def __init__(self, subject: _Optional[str] = ..., via: _Optional[str] = ..., attr: _Optional[str] = ..., owner_module: _Optional[str] = ..., owner_qualname: _Optional[str] = ..., owner_file: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[CodeLayer, _Mapping]]] = ..., probe_layers: _Optional[int] = ..., changes: _Optional[int] = ..., recorded_unix: _Optional[float] = ..., python: _Optional[str] = ..., optimize: _Optional[int] = ..., status: _Optional[str] = ..., detail: _Optional[str] = ..., distribution: _Optional[str] = ...) -> None: ...

class CodeLayer(_message.Message):
    __slots__ = ("kind", "via", "held", "module", "qualname", "code_qualname", "name", "file", "line", "sha256", "globals_file", "check", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    QUALNAME_FIELD_NUMBER: _ClassVar[int]
    CODE_QUALNAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    GLOBALS_FILE_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    via: str
    held: bool
    module: str
    qualname: str
    code_qualname: str
    name: str
    file: str
    line: int
    sha256: str
    globals_file: str
    check: str
    detail: str
    def __init__(self, kind: _Optional[str] = ..., via: _Optional[str] = ..., held: _Optional[bool] = ..., module: _Optional[str] = ..., qualname: _Optional[str] = ..., code_qualname: _Optional[str] = ..., name: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., sha256: _Optional[str] = ..., globals_file: _Optional[str] = ..., check: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class StackWitness(_message.Message):
    __slots__ = ("samples", "runner_file_hits", "runner_file", "top_files", "error")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FILE_HITS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FILE_FIELD_NUMBER: _ClassVar[int]
    TOP_FILES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    samples: int
    runner_file_hits: int
    runner_file: str
    top_files: _containers.RepeatedScalarFieldContainer[str]
    error: str
    def __init__(self, samples: _Optional[int] = ..., runner_file_hits: _Optional[int] = ..., runner_file: _Optional[str] = ..., top_files: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("counts", "files", "distributions", "contents")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    CONTENTS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.ScalarMap[str, int]
    files: _containers.RepeatedCompositeFieldContainer[FileOrigin]
    distributions: _containers.RepeatedCompositeFieldContainer[DistributionFiles]
    contents: _containers.RepeatedCompositeFieldContainer[DistributionContent]
    def __init__(self, counts: _Optional[_Mapping[str, int]] = ..., files: _Optional[_Iterable[_Union[FileOrigin, _Mapping]]] = ..., distributions: _Optional[_Iterable[_Union[DistributionFiles, _Mapping]]] = ..., contents: _Optional[_Iterable[_Union[DistributionContent, _Mapping]]] = ...) -> None: ...

class ChildStarts(_message.Message):
    __slots__ = ("starts",)
    STARTS_FIELD_NUMBER: _ClassVar[int]
    starts: _containers.RepeatedCompositeFieldContainer[ChildStart]
    def __init__(self, starts: _Optional[_Iterable[_Union[ChildStart, _Mapping]]] = ...) -> None: ...

class ChildStart(_message.Message):
    __slots__ = ("pid", "start_ticks")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TICKS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start_ticks: int
    def __init__(self, pid: _Optional[int] = ..., start_ticks: _Optional[int] = ...) -> None: ...

class DistributionContent(_message.Message):
    __slots__ = ("name", "version", "content_sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    content_sha256: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., content_sha256: _Optional[str] = ...) -> None: ...

class DistributionFiles(_message.Message):
    __slots__ = ("name", "version", "files")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    files: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., files: _Optional[int] = ...) -> None: ...

class FileOrigin(_message.Message):
    __slots__ = ("path", "origin", "reason", "distribution", "version", "record_path", "sha256", "expected_sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RECORD_PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    origin: str
    reason: str
    distribution: str
    version: str
    record_path: str
    sha256: str
    expected_sha256: str
    def __init__(self, path: _Optional[str] = ..., origin: _Optional[str] = ..., reason: _Optional[str] = ..., distribution: _Optional[str] = ..., version: _Optional[str] = ..., record_path: _Optional[str] = ..., sha256: _Optional[str] = ..., expected_sha256: _Optional[str] = ...) -> None: ...

class Drift(_message.Message):
    __slots__ = ("id", "path", "module", "detail", "defined_in")
    ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DEFINED_IN_FIELD_NUMBER: _ClassVar[int]
    id: str
    path: str
    module: str
    detail: str
    defined_in: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., path: _Optional[str] = ..., module: _Optional[str] = ..., detail: _Optional[str] = ..., defined_in: _Optional[_Iterable[str]] = ...) -> None: ...

class NativeMapping(_message.Message):
    __slots__ = ("path", "sha256", "size", "state", "error", "device", "inode", "detail")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256: str
    size: int
    state: str
    error: str
    device: str
    inode: int
    detail: str
    def __init__(self, path: _Optional[str] = ..., sha256: _Optional[str] = ..., size: _Optional[int] = ..., state: _Optional[str] = ..., error: _Optional[str] = ..., device: _Optional[str] = ..., inode: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class FileDisagreement(_message.Message):
    __slots__ = ("path", "sha256_in_process", "sha256_agent", "reason")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_IN_PROCESS_FIELD_NUMBER: _ClassVar[int]
    SHA256_AGENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256_in_process: str
    sha256_agent: str
    reason: str
    def __init__(self, path: _Optional[str] = ..., sha256_in_process: _Optional[str] = ..., sha256_agent: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TargetReport(_message.Message):
    __slots__ = ("agent_id", "target", "seq", "nonce", "sent_unix", "processes", "gone", "collected_unix", "containers", "unobservable", "spans", "request_ids", "mixed_roots", "evidence_age_s", "evidence_age_unknown", "nonce_held_s")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    COLLECTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    UNOBSERVABLE_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    MIXED_ROOTS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_AGE_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    NONCE_HELD_S_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    target: str
    seq: int
    nonce: str
    sent_unix: float
    processes: _containers.RepeatedCompositeFieldContainer[ProcessReport]
    gone: _containers.RepeatedCompositeFieldContainer[ProcessKey]
    collected_unix: float
    containers: _containers.RepeatedCompositeFieldContainer[ContainerInfo]
    unobservable: _containers.RepeatedScalarFieldContainer[str]
    spans: _containers.RepeatedCompositeFieldContainer[RequestSpan]
    request_ids: _containers.RepeatedCompositeFieldContainer[RequestId]
    mixed_roots: _containers.RepeatedCompositeFieldContainer[ProcessKey]
    evidence_age_s: float
    evidence_age_unknown: bool
    nonce_held_s: float
    def __init__(self, agent_id: _Optional[str] = ..., target: _Optional[str] = ..., seq: _Optional[int] = ..., nonce: _Optional[str] = ..., sent_unix: _Optional[float] = ..., processes: _Optional[_Iterable[_Union[ProcessReport, _Mapping]]] = ..., gone: _Optional[_Iterable[_Union[ProcessKey, _Mapping]]] = ..., collected_unix: _Optional[float] = ..., containers: _Optional[_Iterable[_Union[ContainerInfo, _Mapping]]] = ..., unobservable: _Optional[_Iterable[str]] = ..., spans: _Optional[_Iterable[_Union[RequestSpan, _Mapping]]] = ..., request_ids: _Optional[_Iterable[_Union[RequestId, _Mapping]]] = ..., mixed_roots: _Optional[_Iterable[_Union[ProcessKey, _Mapping]]] = ..., evidence_age_s: _Optional[float] = ..., evidence_age_unknown: _Optional[bool] = ..., nonce_held_s: _Optional[float] = ...) -> None: ...

class RequestSpan(_message.Message):
    __slots__ = ("process", "internal_id", "first_step", "last_step", "steps", "tokens", "first_unix", "last_unix", "manifest_first", "manifest_last", "runner", "hooks", "finished", "spec")
    class HooksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_UNIX_FIELD_NUMBER: _ClassVar[int]
    LAST_UNIX_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_LAST_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    HOOKS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    process: ProcessKey
    internal_id: str
    first_step: int
    last_step: int
    steps: int
    tokens: int
    first_unix: float
    last_unix: float
    manifest_first: str
    manifest_last: str
    runner: str
    hooks: _containers.ScalarMap[str, int]
    finished: bool
    spec: RequestSpec
    def __init__(self, process: _Optional[_Union[ProcessKey, _Mapping]] = ..., internal_id: _Optional[str] = ..., first_step: _Optional[int] = ..., last_step: _Optional[int] = ..., steps: _Optional[int] = ..., tokens: _Optional[int] = ..., first_unix: _Optional[float] = ..., last_unix: _Optional[float] = ..., manifest_first: _Optional[str] = ..., manifest_last: _Optional[str] = ..., runner: _Optional[str] = ..., hooks: _Optional[_Mapping[str, int]] = ..., finished: _Optional[bool] = ..., spec: _Optional[_Union[RequestSpec, _Mapping]] = ...) -> None: ...

class RequestSpec(_message.Message):
    __slots__ = ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_position", "emitted_tokens")
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    EMITTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    emitted_tokens: int
    def __init__(self, drafts: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., accepted_per_position: _Optional[_Iterable[int]] = ..., emitted_tokens: _Optional[int] = ...) -> None: ...

class RequestId(_message.Message):
    __slots__ = ("process", "internal_id", "external_id", "unix")
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    UNIX_FIELD_NUMBER: _ClassVar[int]
    process: ProcessKey
    internal_id: str
    external_id: str
    unix: float
    def __init__(self, process: _Optional[_Union[ProcessKey, _Mapping]] = ..., internal_id: _Optional[str] = ..., external_id: _Optional[str] = ..., unix: _Optional[float] = ...) -> None: ...

class ContainerInfo(_message.Message):
    __slots__ = ("id", "runtime", "source", "pod_uid", "name", "image", "image_id", "image_digests", "labels", "restart_count", "started_at", "docker_error")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DOCKER_ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    runtime: str
    source: str
    pod_uid: str
    name: str
    image: str
    image_id: str
    image_digests: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    restart_count: int
    started_at: str
    docker_error: str
    def __init__(self, id: _Optional[str] = ..., runtime: _Optional[str] = ..., source: _Optional[str] = ..., pod_uid: _Optional[str] = ..., name: _Optional[str] = ..., image: _Optional[str] = ..., image_id: _Optional[str] = ..., image_digests: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., restart_count: _Optional[int] = ..., started_at: _Optional[str] = ..., docker_error: _Optional[str] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("id", "severity", "message", "target", "context_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    severity: Severity
    message: str
    target: str
    context_json: str
    def __init__(self, id: _Optional[str] = ..., severity: _Optional[_Union[Severity, str]] = ..., message: _Optional[str] = ..., target: _Optional[str] = ..., context_json: _Optional[str] = ...) -> None: ...

class HookCount(_message.Message):
    __slots__ = ("name", "pid", "role", "rank", "fired", "fired_productive", "productive_steps", "total_steps", "fired_decode", "decode_steps", "fired_prefill", "prefill_steps", "fired_outside", "on", "min_fires_per_step")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    FIRED_PRODUCTIVE_FIELD_NUMBER: _ClassVar[int]
    PRODUCTIVE_STEPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    FIRED_DECODE_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    FIRED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_STEPS_FIELD_NUMBER: _ClassVar[int]
    FIRED_OUTSIDE_FIELD_NUMBER: _ClassVar[int]
    ON_FIELD_NUMBER: _ClassVar[int]
    MIN_FIRES_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    name: str
    pid: int
    role: str
    rank: int
    fired: int
    fired_productive: int
    productive_steps: int
    total_steps: int
    fired_decode: int
    decode_steps: int
    fired_prefill: int
    prefill_steps: int
    fired_outside: int
    on: str
    min_fires_per_step: float
    def __init__(self, name: _Optional[str] = ..., pid: _Optional[int] = ..., role: _Optional[str] = ..., rank: _Optional[int] = ..., fired: _Optional[int] = ..., fired_productive: _Optional[int] = ..., productive_steps: _Optional[int] = ..., total_steps: _Optional[int] = ..., fired_decode: _Optional[int] = ..., decode_steps: _Optional[int] = ..., fired_prefill: _Optional[int] = ..., prefill_steps: _Optional[int] = ..., fired_outside: _Optional[int] = ..., on: _Optional[str] = ..., min_fires_per_step: _Optional[float] = ...) -> None: ...

class TargetVerdict(_message.Message):
    __slots__ = ("target", "verdict", "findings", "evaluated_unix", "report_unix", "hooks")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    REPORT_UNIX_FIELD_NUMBER: _ClassVar[int]
    HOOKS_FIELD_NUMBER: _ClassVar[int]
    target: str
    verdict: Verdict
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    evaluated_unix: float
    report_unix: float
    hooks: _containers.RepeatedCompositeFieldContainer[HookCount]
    def __init__(self, target: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., evaluated_unix: _Optional[float] = ..., report_unix: _Optional[float] = ..., hooks: _Optional[_Iterable[_Union[HookCount, _Mapping]]] = ...) -> None: ...

class RunVerdict(_message.Message):
    __slots__ = ("run", "policy_digest", "verdict", "targets", "findings", "evaluated_unix")
    RUN_FIELD_NUMBER: _ClassVar[int]
    POLICY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    run: str
    policy_digest: str
    verdict: Verdict
    targets: _containers.RepeatedCompositeFieldContainer[TargetVerdict]
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    evaluated_unix: float
    def __init__(self, run: _Optional[str] = ..., policy_digest: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., targets: _Optional[_Iterable[_Union[TargetVerdict, _Mapping]]] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., evaluated_unix: _Optional[float] = ...) -> None: ...

class RunSummary(_message.Message):
    __slots__ = ("name", "policy_digest", "created_unix", "verdict", "unsafe_flags")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_FLAGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy_digest: str
    created_unix: float
    verdict: Verdict
    unsafe_flags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., policy_digest: _Optional[str] = ..., created_unix: _Optional[float] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., unsafe_flags: _Optional[_Iterable[str]] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("agent_id", "targets")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent_id: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ...) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("nonce", "report_interval_s", "last_seq")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    report_interval_s: float
    last_seq: int
    def __init__(self, nonce: _Optional[str] = ..., report_interval_s: _Optional[float] = ..., last_seq: _Optional[int] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("report",)
    REPORT_FIELD_NUMBER: _ClassVar[int]
    report: TargetReport
    def __init__(self, report: _Optional[_Union[TargetReport, _Mapping]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("accepted", "seq", "nonce", "need_manifests", "next_report_in_s")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    NEED_MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_REPORT_IN_S_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    seq: int
    nonce: str
    need_manifests: _containers.RepeatedScalarFieldContainer[str]
    next_report_in_s: float
    def __init__(self, accepted: _Optional[bool] = ..., seq: _Optional[int] = ..., nonce: _Optional[str] = ..., need_manifests: _Optional[_Iterable[str]] = ..., next_report_in_s: _Optional[float] = ...) -> None: ...

class RegisterRunRequest(_message.Message):
    __slots__ = ("name", "policy_toml", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_TOML_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy_toml: str
    source: str
    def __init__(self, name: _Optional[str] = ..., policy_toml: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class RegisterRunResponse(_message.Message):
    __slots__ = ("name", "policy_digest", "created_unix")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy_digest: str
    created_unix: float
    def __init__(self, name: _Optional[str] = ..., policy_digest: _Optional[str] = ..., created_unix: _Optional[float] = ...) -> None: ...

class GetRunStatusRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetRunStatusResponse(_message.Message):
    __slots__ = ("verdict",)
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    verdict: RunVerdict
    def __init__(self, verdict: _Optional[_Union[RunVerdict, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunSummary]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunSummary, _Mapping]]] = ...) -> None: ...

class TargetState(_message.Message):
    __slots__ = ("target", "last_report_unix", "age_s", "agent_id", "authenticated_as", "state")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_UNIX_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATED_AS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    target: str
    last_report_unix: float
    age_s: float
    agent_id: str
    authenticated_as: str
    state: str
    def __init__(self, target: _Optional[str] = ..., last_report_unix: _Optional[float] = ..., age_s: _Optional[float] = ..., agent_id: _Optional[str] = ..., authenticated_as: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class ListTargetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTargetsResponse(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetState]
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetState, _Mapping]]] = ...) -> None: ...

class ForgetTargetRequest(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class ForgetTargetResponse(_message.Message):
    __slots__ = ("forgotten",)
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    forgotten: TargetState
    def __init__(self, forgotten: _Optional[_Union[TargetState, _Mapping]] = ...) -> None: ...

class AuditServedRequest(_message.Message):
    __slots__ = ("query", "limit")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    query: str
    limit: int
    def __init__(self, query: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class AuditServedResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: AuditAnswer
    def __init__(self, answer: _Optional[_Union[AuditAnswer, _Mapping]] = ...) -> None: ...

class AuditFileRequest(_message.Message):
    __slots__ = ("query", "limit")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    query: str
    limit: int
    def __init__(self, query: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class AuditFileResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: AuditAnswer
    def __init__(self, answer: _Optional[_Union[AuditAnswer, _Mapping]] = ...) -> None: ...

class AuditRunRequest(_message.Message):
    __slots__ = ("query", "limit")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    query: str
    limit: int
    def __init__(self, query: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class AuditRunResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: AuditAnswer
    def __init__(self, answer: _Optional[_Union[AuditAnswer, _Mapping]] = ...) -> None: ...

class AuditAnswer(_message.Message):
    __slots__ = ("bundle", "total", "truncated", "note", "omitted")
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    OMITTED_FIELD_NUMBER: _ClassVar[int]
    bundle: bytes
    total: int
    truncated: bool
    note: str
    omitted: _containers.RepeatedCompositeFieldContainer[AuditOmitted]
    def __init__(self, bundle: _Optional[bytes] = ..., total: _Optional[int] = ..., truncated: _Optional[bool] = ..., note: _Optional[str] = ..., omitted: _Optional[_Iterable[_Union[AuditOmitted, _Mapping]]] = ...) -> None: ...

class AuditOmitted(_message.Message):
    __slots__ = ("target", "record", "bytes")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    target: str
    record: str
    bytes: int
    def __init__(self, target: _Optional[str] = ..., record: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class AuditCheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AuditCheckpointResponse(_message.Message):
    __slots__ = ("note",)
    NOTE_FIELD_NUMBER: _ClassVar[int]
    note: str
    def __init__(self, note: _Optional[str] = ...) -> None: ...

class AuditConsistencyRequest(_message.Message):
    __slots__ = ("old_size",)
    OLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    old_size: int
    def __init__(self, old_size: _Optional[int] = ...) -> None: ...

class AuditConsistencyResponse(_message.Message):
    __slots__ = ("note", "proof", "old_root")
    NOTE_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    OLD_ROOT_FIELD_NUMBER: _ClassVar[int]
    note: str
    proof: _containers.RepeatedScalarFieldContainer[bytes]
    old_root: bytes
    def __init__(self, note: _Optional[str] = ..., proof: _Optional[_Iterable[bytes]] = ..., old_root: _Optional[bytes] = ...) -> None: ...

class OpenWindowRequest(_message.Message):
    __slots__ = ("run", "timeout_s")
    RUN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    run: str
    timeout_s: float
    def __init__(self, run: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class OpenWindowResponse(_message.Message):
    __slots__ = ("window_id", "run", "policy_digest", "opened_unix", "ledger_seq", "ledger_hash")
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    POLICY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEDGER_HASH_FIELD_NUMBER: _ClassVar[int]
    window_id: str
    run: str
    policy_digest: str
    opened_unix: float
    ledger_seq: int
    ledger_hash: str
    def __init__(self, window_id: _Optional[str] = ..., run: _Optional[str] = ..., policy_digest: _Optional[str] = ..., opened_unix: _Optional[float] = ..., ledger_seq: _Optional[int] = ..., ledger_hash: _Optional[str] = ...) -> None: ...

class SealWindowRequest(_message.Message):
    __slots__ = ("window_id", "run", "results_sha256", "results_size", "results_name", "timeout_s", "request_ids")
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    RESULTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    RESULTS_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_NAME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    window_id: str
    run: str
    results_sha256: str
    results_size: int
    results_name: str
    timeout_s: float
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, window_id: _Optional[str] = ..., run: _Optional[str] = ..., results_sha256: _Optional[str] = ..., results_size: _Optional[int] = ..., results_name: _Optional[str] = ..., timeout_s: _Optional[float] = ..., request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SealWindowResponse(_message.Message):
    __slots__ = ("held", "seal_json")
    HELD_FIELD_NUMBER: _ClassVar[int]
    SEAL_JSON_FIELD_NUMBER: _ClassVar[int]
    held: bool
    seal_json: str
    def __init__(self, held: _Optional[bool] = ..., seal_json: _Optional[str] = ...) -> None: ...
