"""The lease actor's old module name, for :mod:`remote_env.pool.attach` only.

The lease actor is :mod:`remote_env.pool.lease_actor` (its rules
:mod:`remote_env.pool.lease_rules`); "registry" is the Prometheus registry. This
alias keeps the trainer side's imports working until it imports
``lease_actor`` itself; then delete it.
"""

from __future__ import annotations

from remote_env.pool.lease_actor import LEASE_ACTOR_NAME as REGISTRY_NAME
from remote_env.pool.lease_actor import get_lease_actor as get_registry
from remote_env.pool.lease_rules import LeaseError

__all__ = ["REGISTRY_NAME", "LeaseError", "get_registry"]
