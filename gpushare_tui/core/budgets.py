"""What a reader may spend on untrusted input: one place, each budget with its unit and its reason.

Segments (any local user can create `/opencoti-gpu-*` in /dev/shm; a share group's members write ours).
"""

from __future__ import annotations

# A torn slot (odd or changing seqlock word) is re-read this many times in all, with no sleep between: a
# live writer finishes its seqlock write in nanoseconds; one descheduled mid-write, or a static file with
# odd words, must cost a reader microseconds, not a sleeping back-off (what is still torn is reported).
SEQLOCK_REREADS = 2

# Foreign segments (not our uid, not root's, not our share group's, not the --gpu-key named) read per
# refresh at most: the dashboard, --once and serve show this many, and count the rest as not shown.
FOREIGN_SEGMENTS_SHOWN_MAX = 64

# Wall time one refresh may spend reading foreign segments (ours are read first, outside this budget):
# the dashboard refreshes every second and our own rows must be shown within it.
FOREIGN_READ_BUDGET_S = 0.25

# With --all-owners (no count cap) one refresh still stops reading foreign segments after this long.
FOREIGN_READ_BUDGET_ALL_OWNERS_S = 5.0
