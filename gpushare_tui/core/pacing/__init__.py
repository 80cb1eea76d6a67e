"""In-process pacing: the pacer (one peer's windows), GpuShare behind the public API, the step
rate, and the per-engine control socket that steers a pacer or a supervisor."""
