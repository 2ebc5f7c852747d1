"""Code workflows the adversary tests run in subprocesses (``attempt-kernel run agentflows.agents:ATTR``)."""
