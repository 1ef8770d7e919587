from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Capability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPABILITY_UNSPECIFIED: _ClassVar[Capability]
    CAPABILITY_SHELL_EXEC: _ClassVar[Capability]
    CAPABILITY_HOOKS_JS: _ClassVar[Capability]
    CAPABILITY_HOOKS_RUST: _ClassVar[Capability]
    CAPABILITY_REPLAY: _ClassVar[Capability]
    CAPABILITY_NATS: _ClassVar[Capability]
    CAPABILITY_TRACING: _ClassVar[Capability]
    CAPABILITY_WORKSPACES: _ClassVar[Capability]

class ServiceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVICE_STATE_UNSPECIFIED: _ClassVar[ServiceState]
    SERVICE_STATE_STARTING: _ClassVar[ServiceState]
    SERVICE_STATE_READY: _ClassVar[ServiceState]
    SERVICE_STATE_PROCESSING: _ClassVar[ServiceState]
    SERVICE_STATE_ERROR: _ClassVar[ServiceState]
    SERVICE_STATE_SHUTTING: _ClassVar[ServiceState]

class LogLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOG_LEVEL_UNSPECIFIED: _ClassVar[LogLevel]
    LOG_LEVEL_TRACE: _ClassVar[LogLevel]
    LOG_LEVEL_DEBUG: _ClassVar[LogLevel]
    LOG_LEVEL_INFO: _ClassVar[LogLevel]
    LOG_LEVEL_WARN: _ClassVar[LogLevel]
    LOG_LEVEL_ERROR: _ClassVar[LogLevel]

class HookActionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOOK_ACTION_TYPE_UNSPECIFIED: _ClassVar[HookActionType]
    HOOK_ACTION_TYPE_ALLOW: _ClassVar[HookActionType]
    HOOK_ACTION_TYPE_BLOCK: _ClassVar[HookActionType]
    HOOK_ACTION_TYPE_TRANSFORM: _ClassVar[HookActionType]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_UNSUPPORTED_VERSION: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_CAPABILITY: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TOOL: _ClassVar[ErrorCode]
    ERROR_CODE_EXECUTION_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL_ERROR: _ClassVar[ErrorCode]

class ChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANGE_KIND_UNSPECIFIED: _ClassVar[ChangeKind]
    CHANGE_KIND_ADDED: _ClassVar[ChangeKind]
    CHANGE_KIND_MODIFIED: _ClassVar[ChangeKind]
    CHANGE_KIND_DELETED: _ClassVar[ChangeKind]
CAPABILITY_UNSPECIFIED: Capability
CAPABILITY_SHELL_EXEC: Capability
CAPABILITY_HOOKS_JS: Capability
CAPABILITY_HOOKS_RUST: Capability
CAPABILITY_REPLAY: Capability
CAPABILITY_NATS: Capability
CAPABILITY_TRACING: Capability
CAPABILITY_WORKSPACES: Capability
SERVICE_STATE_UNSPECIFIED: ServiceState
SERVICE_STATE_STARTING: ServiceState
SERVICE_STATE_READY: ServiceState
SERVICE_STATE_PROCESSING: ServiceState
SERVICE_STATE_ERROR: ServiceState
SERVICE_STATE_SHUTTING: ServiceState
LOG_LEVEL_UNSPECIFIED: LogLevel
LOG_LEVEL_TRACE: LogLevel
LOG_LEVEL_DEBUG: LogLevel
LOG_LEVEL_INFO: LogLevel
LOG_LEVEL_WARN: LogLevel
LOG_LEVEL_ERROR: LogLevel
HOOK_ACTION_TYPE_UNSPECIFIED: HookActionType
HOOK_ACTION_TYPE_ALLOW: HookActionType
HOOK_ACTION_TYPE_BLOCK: HookActionType
HOOK_ACTION_TYPE_TRANSFORM: HookActionType
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_UNSUPPORTED_VERSION: ErrorCode
ERROR_CODE_INVALID_CAPABILITY: ErrorCode
ERROR_CODE_INVALID_TOOL: ErrorCode
ERROR_CODE_EXECUTION_TIMEOUT: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode
ERROR_CODE_INTERNAL_ERROR: ErrorCode
CHANGE_KIND_UNSPECIFIED: ChangeKind
CHANGE_KIND_ADDED: ChangeKind
CHANGE_KIND_MODIFIED: ChangeKind
CHANGE_KIND_DELETED: ChangeKind

class Envelope(_message.Message):
    __slots__ = ("timestamp", "sequence", "command", "event", "batch_command", "batch_event", "health_check_request", "health_check_response", "metrics", "resource_usage")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    BATCH_COMMAND_FIELD_NUMBER: _ClassVar[int]
    BATCH_EVENT_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_REQUEST_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_USAGE_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    sequence: int
    command: Command
    event: Event
    batch_command: BatchCommand
    batch_event: BatchEvent
    health_check_request: HealthCheckRequest
    health_check_response: HealthCheckResponse
    metrics: MetricsEvent
    resource_usage: ResourceUsageEvent
    def __init__(self, timestamp: _Optional[int] = ..., sequence: _Optional[int] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., event: _Optional[_Union[Event, _Mapping]] = ..., batch_command: _Optional[_Union[BatchCommand, _Mapping]] = ..., batch_event: _Optional[_Union[BatchEvent, _Mapping]] = ..., health_check_request: _Optional[_Union[HealthCheckRequest, _Mapping]] = ..., health_check_response: _Optional[_Union[HealthCheckResponse, _Mapping]] = ..., metrics: _Optional[_Union[MetricsEvent, _Mapping]] = ..., resource_usage: _Optional[_Union[ResourceUsageEvent, _Mapping]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("handshake", "plan", "tool_call", "hook_load", "shell_exec", "shutdown", "cancel", "stdin", "resize", "list_processes", "attach", "checkpoint", "restore", "diff", "undo")
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    HOOK_LOAD_FIELD_NUMBER: _ClassVar[int]
    SHELL_EXEC_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    RESIZE_FIELD_NUMBER: _ClassVar[int]
    LIST_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    UNDO_FIELD_NUMBER: _ClassVar[int]
    handshake: HandshakeCommand
    plan: PlanCommand
    tool_call: ToolCallCommand
    hook_load: HookLoadCommand
    shell_exec: ShellExecCommand
    shutdown: ShutdownCommand
    cancel: CancelCommand
    stdin: StdinCommand
    resize: ResizeCommand
    list_processes: ListProcessesCommand
    attach: AttachCommand
    checkpoint: CheckpointCommand
    restore: RestoreCommand
    diff: DiffCommand
    undo: UndoCommand
    def __init__(self, handshake: _Optional[_Union[HandshakeCommand, _Mapping]] = ..., plan: _Optional[_Union[PlanCommand, _Mapping]] = ..., tool_call: _Optional[_Union[ToolCallCommand, _Mapping]] = ..., hook_load: _Optional[_Union[HookLoadCommand, _Mapping]] = ..., shell_exec: _Optional[_Union[ShellExecCommand, _Mapping]] = ..., shutdown: _Optional[_Union[ShutdownCommand, _Mapping]] = ..., cancel: _Optional[_Union[CancelCommand, _Mapping]] = ..., stdin: _Optional[_Union[StdinCommand, _Mapping]] = ..., resize: _Optional[_Union[ResizeCommand, _Mapping]] = ..., list_processes: _Optional[_Union[ListProcessesCommand, _Mapping]] = ..., attach: _Optional[_Union[AttachCommand, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointCommand, _Mapping]] = ..., restore: _Optional[_Union[RestoreCommand, _Mapping]] = ..., diff: _Optional[_Union[DiffCommand, _Mapping]] = ..., undo: _Optional[_Union[UndoCommand, _Mapping]] = ...) -> None: ...

class HandshakeCommand(_message.Message):
    __slots__ = ("version", "capabilities", "client_info", "resume_token", "resume_after")
    class ClientInfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_INFO_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESUME_AFTER_FIELD_NUMBER: _ClassVar[int]
    version: int
    capabilities: _containers.RepeatedScalarFieldContainer[Capability]
    client_info: _containers.ScalarMap[str, str]
    resume_token: str
    resume_after: int
    def __init__(self, version: _Optional[int] = ..., capabilities: _Optional[_Iterable[_Union[Capability, str]]] = ..., client_info: _Optional[_Mapping[str, str]] = ..., resume_token: _Optional[str] = ..., resume_after: _Optional[int] = ...) -> None: ...

class PlanCommand(_message.Message):
    __slots__ = ("request_id", "goal", "context")
    class ContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    goal: str
    context: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., goal: _Optional[str] = ..., context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ToolCallCommand(_message.Message):
    __slots__ = ("request_id", "tool", "args", "timeout_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tool: str
    args: bytes
    timeout_ms: int
    def __init__(self, request_id: _Optional[str] = ..., tool: _Optional[str] = ..., args: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class HookLoadCommand(_message.Message):
    __slots__ = ("request_id", "hook_type", "script")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HOOK_TYPE_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    hook_type: str
    script: str
    def __init__(self, request_id: _Optional[str] = ..., hook_type: _Optional[str] = ..., script: _Optional[str] = ...) -> None: ...

class ShellExecCommand(_message.Message):
    __slots__ = ("request_id", "command", "shell", "cwd", "env", "timeout_ms", "open_stdin", "pty", "binary_output", "background")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    OPEN_STDIN_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    BINARY_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    command: str
    shell: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    timeout_ms: int
    open_stdin: bool
    pty: PtyRequest
    binary_output: bool
    background: bool
    def __init__(self, request_id: _Optional[str] = ..., command: _Optional[str] = ..., shell: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., timeout_ms: _Optional[int] = ..., open_stdin: _Optional[bool] = ..., pty: _Optional[_Union[PtyRequest, _Mapping]] = ..., binary_output: _Optional[bool] = ..., background: _Optional[bool] = ...) -> None: ...

class PtyRequest(_message.Message):
    __slots__ = ("rows", "cols", "term")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    term: str
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ..., term: _Optional[str] = ...) -> None: ...

class CancelCommand(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class StdinCommand(_message.Message):
    __slots__ = ("request_id", "data", "eof")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    data: bytes
    eof: bool
    def __init__(self, request_id: _Optional[str] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class ResizeCommand(_message.Message):
    __slots__ = ("request_id", "rows", "cols")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    rows: int
    cols: int
    def __init__(self, request_id: _Optional[str] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class ListProcessesCommand(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AttachCommand(_message.Message):
    __slots__ = ("request_id", "process_id", "from_offset", "binary_output")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BINARY_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    process_id: str
    from_offset: int
    binary_output: bool
    def __init__(self, request_id: _Optional[str] = ..., process_id: _Optional[str] = ..., from_offset: _Optional[int] = ..., binary_output: _Optional[bool] = ...) -> None: ...

class CheckpointCommand(_message.Message):
    __slots__ = ("request_id", "label")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    label: str
    def __init__(self, request_id: _Optional[str] = ..., label: _Optional[str] = ...) -> None: ...

class RestoreCommand(_message.Message):
    __slots__ = ("request_id", "checkpoint_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    checkpoint_id: str
    def __init__(self, request_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class DiffCommand(_message.Message):
    __slots__ = ("request_id", "from_id", "to_id", "max_diff_bytes", "paths")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_DIFF_BYTES_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    from_id: str
    to_id: str
    max_diff_bytes: int
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., max_diff_bytes: _Optional[int] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class UndoCommand(_message.Message):
    __slots__ = ("request_id", "target_request_id", "force")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    target_request_id: str
    force: bool
    def __init__(self, request_id: _Optional[str] = ..., target_request_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class WorkspaceEvent(_message.Message):
    __slots__ = ("request_id", "checkpoint_id", "changes", "conflicts", "truncated", "workspace_bytes", "cancelled")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    checkpoint_id: str
    changes: _containers.RepeatedCompositeFieldContainer[FileChange]
    conflicts: _containers.RepeatedScalarFieldContainer[str]
    truncated: bool
    workspace_bytes: int
    cancelled: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., changes: _Optional[_Iterable[_Union[FileChange, _Mapping]]] = ..., conflicts: _Optional[_Iterable[str]] = ..., truncated: _Optional[bool] = ..., workspace_bytes: _Optional[int] = ..., cancelled: _Optional[_Iterable[str]] = ...) -> None: ...

class FileChanges(_message.Message):
    __slots__ = ("changes", "exact", "shared_with", "truncated")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    SHARED_WITH_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[FileChange]
    exact: bool
    shared_with: _containers.RepeatedScalarFieldContainer[str]
    truncated: bool
    def __init__(self, changes: _Optional[_Iterable[_Union[FileChange, _Mapping]]] = ..., exact: _Optional[bool] = ..., shared_with: _Optional[_Iterable[str]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class FileChange(_message.Message):
    __slots__ = ("path", "kind", "size", "file_type", "unified_diff", "old_size")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    FILE_TYPE_FIELD_NUMBER: _ClassVar[int]
    UNIFIED_DIFF_FIELD_NUMBER: _ClassVar[int]
    OLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: ChangeKind
    size: int
    file_type: str
    unified_diff: str
    old_size: int
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[ChangeKind, str]] = ..., size: _Optional[int] = ..., file_type: _Optional[str] = ..., unified_diff: _Optional[str] = ..., old_size: _Optional[int] = ...) -> None: ...

class ShutdownCommand(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Event(_message.Message):
    __slots__ = ("ready", "state_change", "log", "token_usage", "shell_output", "tool_result", "hook_result", "graph_delta", "error", "process_list", "workspace")
    READY_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    TOKEN_USAGE_FIELD_NUMBER: _ClassVar[int]
    SHELL_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    HOOK_RESULT_FIELD_NUMBER: _ClassVar[int]
    GRAPH_DELTA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROCESS_LIST_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    ready: ReadyEvent
    state_change: StateChangeEvent
    log: LogEvent
    token_usage: TokenUsageEvent
    shell_output: ShellOutputEvent
    tool_result: ToolResultEvent
    hook_result: HookResultEvent
    graph_delta: GraphDeltaEvent
    error: ErrorEvent
    process_list: ProcessListEvent
    workspace: WorkspaceEvent
    def __init__(self, ready: _Optional[_Union[ReadyEvent, _Mapping]] = ..., state_change: _Optional[_Union[StateChangeEvent, _Mapping]] = ..., log: _Optional[_Union[LogEvent, _Mapping]] = ..., token_usage: _Optional[_Union[TokenUsageEvent, _Mapping]] = ..., shell_output: _Optional[_Union[ShellOutputEvent, _Mapping]] = ..., tool_result: _Optional[_Union[ToolResultEvent, _Mapping]] = ..., hook_result: _Optional[_Union[HookResultEvent, _Mapping]] = ..., graph_delta: _Optional[_Union[GraphDeltaEvent, _Mapping]] = ..., error: _Optional[_Union[ErrorEvent, _Mapping]] = ..., process_list: _Optional[_Union[ProcessListEvent, _Mapping]] = ..., workspace: _Optional[_Union[WorkspaceEvent, _Mapping]] = ...) -> None: ...

class ReadyEvent(_message.Message):
    __slots__ = ("version", "capabilities", "service_id", "service_info", "resume_token", "resumed")
    class ServiceInfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_INFO_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    version: int
    capabilities: _containers.RepeatedScalarFieldContainer[Capability]
    service_id: str
    service_info: _containers.ScalarMap[str, str]
    resume_token: str
    resumed: bool
    def __init__(self, version: _Optional[int] = ..., capabilities: _Optional[_Iterable[_Union[Capability, str]]] = ..., service_id: _Optional[str] = ..., service_info: _Optional[_Mapping[str, str]] = ..., resume_token: _Optional[str] = ..., resumed: _Optional[bool] = ...) -> None: ...

class StateChangeEvent(_message.Message):
    __slots__ = ("request_id", "state", "timestamp")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    state: ServiceState
    timestamp: int
    def __init__(self, request_id: _Optional[str] = ..., state: _Optional[_Union[ServiceState, str]] = ..., timestamp: _Optional[int] = ...) -> None: ...

class LogEvent(_message.Message):
    __slots__ = ("level", "message", "timestamp", "request_id", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    level: LogLevel
    message: str
    timestamp: int
    request_id: str
    fields: _containers.ScalarMap[str, str]
    def __init__(self, level: _Optional[_Union[LogLevel, str]] = ..., message: _Optional[str] = ..., timestamp: _Optional[int] = ..., request_id: _Optional[str] = ..., fields: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TokenUsageEvent(_message.Message):
    __slots__ = ("request_id", "tokens_used", "tokens_remaining", "model")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_REMAINING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tokens_used: int
    tokens_remaining: int
    model: str
    def __init__(self, request_id: _Optional[str] = ..., tokens_used: _Optional[int] = ..., tokens_remaining: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class ShellOutputEvent(_message.Message):
    __slots__ = ("request_id", "stdout", "stderr", "exit_code", "finished", "stdout_bytes", "stderr_bytes", "stdin_written", "offset", "changes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDERR_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDIN_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    stdout: str
    stderr: str
    exit_code: int
    finished: bool
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdin_written: int
    offset: int
    changes: FileChanges
    def __init__(self, request_id: _Optional[str] = ..., stdout: _Optional[str] = ..., stderr: _Optional[str] = ..., exit_code: _Optional[int] = ..., finished: _Optional[bool] = ..., stdout_bytes: _Optional[bytes] = ..., stderr_bytes: _Optional[bytes] = ..., stdin_written: _Optional[int] = ..., offset: _Optional[int] = ..., changes: _Optional[_Union[FileChanges, _Mapping]] = ...) -> None: ...

class ProcessListEvent(_message.Message):
    __slots__ = ("request_id", "processes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    processes: _containers.RepeatedCompositeFieldContainer[BackgroundProcess]
    def __init__(self, request_id: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[BackgroundProcess, _Mapping]]] = ...) -> None: ...

class BackgroundProcess(_message.Message):
    __slots__ = ("id", "command", "state", "exit_code", "pid", "started_ms", "ended_ms", "first_offset", "next_offset", "retained", "attached", "stdin_open", "pty")
    ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_MS_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    STDIN_OPEN_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    id: str
    command: str
    state: str
    exit_code: int
    pid: int
    started_ms: int
    ended_ms: int
    first_offset: int
    next_offset: int
    retained: int
    attached: int
    stdin_open: bool
    pty: bool
    def __init__(self, id: _Optional[str] = ..., command: _Optional[str] = ..., state: _Optional[str] = ..., exit_code: _Optional[int] = ..., pid: _Optional[int] = ..., started_ms: _Optional[int] = ..., ended_ms: _Optional[int] = ..., first_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., retained: _Optional[int] = ..., attached: _Optional[int] = ..., stdin_open: _Optional[bool] = ..., pty: _Optional[bool] = ...) -> None: ...

class ToolResultEvent(_message.Message):
    __slots__ = ("request_id", "success", "result", "error", "duration_ms", "changes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    success: bool
    result: bytes
    error: str
    duration_ms: int
    changes: FileChanges
    def __init__(self, request_id: _Optional[str] = ..., success: _Optional[bool] = ..., result: _Optional[bytes] = ..., error: _Optional[str] = ..., duration_ms: _Optional[int] = ..., changes: _Optional[_Union[FileChanges, _Mapping]] = ...) -> None: ...

class HookResultEvent(_message.Message):
    __slots__ = ("request_id", "action")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    action: HookAction
    def __init__(self, request_id: _Optional[str] = ..., action: _Optional[_Union[HookAction, _Mapping]] = ...) -> None: ...

class HookAction(_message.Message):
    __slots__ = ("type", "allowed_data", "block_reason", "transformed_data")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_DATA_FIELD_NUMBER: _ClassVar[int]
    BLOCK_REASON_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMED_DATA_FIELD_NUMBER: _ClassVar[int]
    type: HookActionType
    allowed_data: bytes
    block_reason: str
    transformed_data: bytes
    def __init__(self, type: _Optional[_Union[HookActionType, str]] = ..., allowed_data: _Optional[bytes] = ..., block_reason: _Optional[str] = ..., transformed_data: _Optional[bytes] = ...) -> None: ...

class GraphDeltaEvent(_message.Message):
    __slots__ = ("request_id", "nodes_added", "edges_added", "nodes_removed", "edges_removed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_ADDED_FIELD_NUMBER: _ClassVar[int]
    EDGES_ADDED_FIELD_NUMBER: _ClassVar[int]
    NODES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    EDGES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    nodes_added: _containers.RepeatedCompositeFieldContainer[GraphNode]
    edges_added: _containers.RepeatedCompositeFieldContainer[GraphEdge]
    nodes_removed: _containers.RepeatedScalarFieldContainer[str]
    edges_removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., nodes_added: _Optional[_Iterable[_Union[GraphNode, _Mapping]]] = ..., edges_added: _Optional[_Iterable[_Union[GraphEdge, _Mapping]]] = ..., nodes_removed: _Optional[_Iterable[str]] = ..., edges_removed: _Optional[_Iterable[str]] = ...) -> None: ...

class GraphNode(_message.Message):
    __slots__ = ("id", "label", "node_type", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    label: str
    node_type: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., label: _Optional[str] = ..., node_type: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GraphEdge(_message.Message):
    __slots__ = ("id", "to", "label", "edge_type")
    ID_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    EDGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    id: str
    to: str
    label: str
    edge_type: str
    def __init__(self, id: _Optional[str] = ..., to: _Optional[str] = ..., label: _Optional[str] = ..., edge_type: _Optional[str] = ..., **kwargs) -> None: ...

class ErrorEvent(_message.Message):
    __slots__ = ("request_id", "error_code", "message", "timestamp", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    error_code: ErrorCode
    message: str
    timestamp: int
    details: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., timestamp: _Optional[int] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NegotiateRequest(_message.Message):
    __slots__ = ("supported_versions", "capabilities", "client_metadata")
    class ClientMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SUPPORTED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    supported_versions: _containers.RepeatedScalarFieldContainer[int]
    capabilities: _containers.RepeatedScalarFieldContainer[Capability]
    client_metadata: _containers.ScalarMap[str, str]
    def __init__(self, supported_versions: _Optional[_Iterable[int]] = ..., capabilities: _Optional[_Iterable[_Union[Capability, str]]] = ..., client_metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NegotiateResponse(_message.Message):
    __slots__ = ("selected_version", "capabilities", "service_metadata", "fallback_to_jsonl")
    class ServiceMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SELECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SERVICE_METADATA_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_TO_JSONL_FIELD_NUMBER: _ClassVar[int]
    selected_version: int
    capabilities: _containers.RepeatedScalarFieldContainer[Capability]
    service_metadata: _containers.ScalarMap[str, str]
    fallback_to_jsonl: bool
    def __init__(self, selected_version: _Optional[int] = ..., capabilities: _Optional[_Iterable[_Union[Capability, str]]] = ..., service_metadata: _Optional[_Mapping[str, str]] = ..., fallback_to_jsonl: _Optional[bool] = ...) -> None: ...

class BatchCommand(_message.Message):
    __slots__ = ("commands", "require_ordering")
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_ORDERING_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[Command]
    require_ordering: bool
    def __init__(self, commands: _Optional[_Iterable[_Union[Command, _Mapping]]] = ..., require_ordering: _Optional[bool] = ...) -> None: ...

class BatchEvent(_message.Message):
    __slots__ = ("events", "partial_batch")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    partial_batch: bool
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., partial_batch: _Optional[bool] = ...) -> None: ...

class HealthCheckRequest(_message.Message):
    __slots__ = ("service_name",)
    SERVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    service_name: str
    def __init__(self, service_name: _Optional[str] = ...) -> None: ...

class HealthCheckResponse(_message.Message):
    __slots__ = ("status", "metrics")
    class ServingStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SERVING_STATUS_UNSPECIFIED: _ClassVar[HealthCheckResponse.ServingStatus]
        SERVING_STATUS_SERVING: _ClassVar[HealthCheckResponse.ServingStatus]
        SERVING_STATUS_NOT_SERVING: _ClassVar[HealthCheckResponse.ServingStatus]
        SERVING_STATUS_SERVICE_UNKNOWN: _ClassVar[HealthCheckResponse.ServingStatus]
    SERVING_STATUS_UNSPECIFIED: HealthCheckResponse.ServingStatus
    SERVING_STATUS_SERVING: HealthCheckResponse.ServingStatus
    SERVING_STATUS_NOT_SERVING: HealthCheckResponse.ServingStatus
    SERVING_STATUS_SERVICE_UNKNOWN: HealthCheckResponse.ServingStatus
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    status: HealthCheckResponse.ServingStatus
    metrics: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[_Union[HealthCheckResponse.ServingStatus, str]] = ..., metrics: _Optional[_Mapping[str, str]] = ...) -> None: ...

class MetricsEvent(_message.Message):
    __slots__ = ("metric_name", "value", "timestamp", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METRIC_NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    metric_name: str
    value: float
    timestamp: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, metric_name: _Optional[str] = ..., value: _Optional[float] = ..., timestamp: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceUsageEvent(_message.Message):
    __slots__ = ("memory_bytes", "cpu_percent", "file_descriptors", "network_connections", "timestamp")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FILE_DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    cpu_percent: float
    file_descriptors: int
    network_connections: int
    timestamp: int
    def __init__(self, memory_bytes: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., file_descriptors: _Optional[int] = ..., network_connections: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...
