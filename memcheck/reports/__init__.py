"""Reports of a session: terminal table, JSON, Markdown (also the merge-request comment)."""
from .report import Report

__all__ = ["Report"]
