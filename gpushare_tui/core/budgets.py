"""What a reader may spend on input another user or host controls: one place, each budget with
its unit in its name and the reason for its size (docs/trust.md says what each surface promises)."""

from __future__ import annotations

from .abi import SLOT_COUNT

# -- files and directories (issue 17, part "paths") ---------------------------------------------

CONFIG_MAX_BYTES = 1024 * 1024  # a real `up` config is a few KiB: 1 MiB is far more than any, and bounds a hostile one
ENGINES_PER_KEY_MAX = SLOT_COUNT  # the registry has 16 slots: a 17th engine on one key could never join
LOG_TAIL_MAX_BYTES = 1024 * 1024  # `logs -n N` reads at most the log's last 1 MiB: a tail is for a person to read
LOG_OUTPUT_MAX_BYTES = 4 * 1024 * 1024  # and writes at most 4 MiB (a NUL becomes a 3-byte U+FFFD, a tab 8 spaces)
LOG_FOLLOW_READ_MAX_BYTES = 1024 * 1024  # `logs -f` reads at most 1 MiB per poll (a burst skips ahead, as the L pane)
