"""Identities and permissions for a secured deployment: ``reach auth``.

NATS decentralized JWT auth with one scoped signing key per role (agent, caller, worker,
coordinator, operator); permission templates in :mod:`agentreach.auth.roles`, the keys and
creds files in an :class:`AuthDirectory`.
"""

from agentreach.auth.directory import AuthDirectory, AuthError, push
from agentreach.auth.roles import ROLES, expanded, permissions

__all__ = ["ROLES", "AuthDirectory", "AuthError", "expanded", "permissions", "push"]
