"""One env actor position of a pool (a slot), its published record and the small
helpers around its actor."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Final, Literal

from remote_env import restarts as restarts_mod
from remote_env import spec as spec_mod

HOST_NAME_RE: Final = re.compile(r"^host-(\d+)-g(\d+)$")

SlotState = Literal["starting", "ready", "backoff", "failed"]


@dataclasses.dataclass(frozen=True)
class SlotInfo:
    """One env actor of the pool, as the pool server last published it."""

    slot: int
    actor_name: str
    actor_id: str  # hex; changes when the actor is replaced
    num_envs: int
    state: SlotState
    restarts: int = 0
    node_id: str = ""
    last_error: str = ""
    #: consecutive failures (the restart streak): a restarted pool server goes on counting
    streak: int = 0
    #: the spec revision the actor was built from (``PoolSpec.revision``; "": unknown)
    revision: str = ""


def host_name(slot: int, generation: int) -> str:
    return f"host-{slot:05d}-g{generation}"


def generation_of(actor_name: str) -> int:
    """The generation in an actor name ``host-<slot>-g<generation>`` (0: not such a name)."""
    m = HOST_NAME_RE.match(actor_name)
    return int(m.group(2)) if m else 0


def node_id(_host: Any) -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


@dataclasses.dataclass
class ActorSlot:
    """One env actor position of the pool and its supervision state: a record that
    only :class:`~remote_env.pool.supervisor.ActorSupervisor` writes."""

    slot: int
    num_envs: int
    generation: int = 0
    handle: Any = None
    actor_id: str = ""
    state: SlotState = "starting"
    start_ref: Any = None
    # when the supervisor first saw the current start() pending (its deadline's origin)
    start_seen: float | None = None
    ping_ref: Any = None
    ping_sent: float = 0.0
    # when the actor stopped answering (first unanswered ping), for hang detection
    silent_since: float | None = None
    restarts: int = 0
    # consecutive failures; up since the actor last became ready
    streak: restarts_mod.Streak = dataclasses.field(default_factory=restarts_mod.Streak)
    retry_at: float = 0.0
    last_error: str = ""
    node_id: str = ""
    after_failure: bool = False
    # False for an adopted actor the lease actor had no record of, until start() tells
    size_known: bool = True
    # the spec revision its actor was built from: another one is rolled (rollout.plan)
    revision: str = ""

    @property
    def name(self) -> str:
        return host_name(self.slot, self.generation)

    def info(self) -> SlotInfo:
        return SlotInfo(
            self.slot, self.name, self.actor_id, self.num_envs, self.state, self.restarts,
            self.node_id, self.last_error, self.streak.failures, self.revision,
        )


def signature(spec: spec_mod.PoolSpec) -> str:
    """A short hash of what the pool's actors are built from."""
    blob = json.dumps(spec.host_signature(), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def kill(handle: Any) -> None:
    if handle is None:
        return
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already dead
        pass


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
