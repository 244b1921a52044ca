"""The knights replication figure (report §3.4). (In progress.)"""
from __future__ import annotations
