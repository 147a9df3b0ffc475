"""Cache policies for the CPU (and GPU) cache tier and a simulator that replays sampled traces."""

from moment.caching.policies import POLICIES, CachePolicy, Decision, SlotMap, make_policy

__all__ = ["POLICIES", "CachePolicy", "Decision", "SlotMap", "make_policy"]
