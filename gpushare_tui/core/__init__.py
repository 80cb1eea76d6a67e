"""Core library: ABI, segment I/O, membership, schedule, pacing, snapshots. No UI imports."""
