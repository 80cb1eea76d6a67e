"""What is, read and derived: immutable snapshots of segments (with the schedule in force), per-peer
device-time and energy accounting, the GPUs and their energy counters. Above core/schedule, below
pacing: the views, the pacers and the supervisor all read through it."""
