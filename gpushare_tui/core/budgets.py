"""What a reader may spend on input it does not trust: one place for every budget (time, bytes,
count, depth), each with its unit in its name and the reason for its value (design.md, "Budgets
at the boundary"). docs/trust.md says what each surface promises against a hostile host.
"""

from __future__ import annotations

# -- control sockets (core/control.py) --------------------------------------------------------

# A client of the control socket writes its one request line right after connecting; even a
# loaded 2-core box delivers it within milliseconds. A connection that sends nothing holds one of
# the MAX_CONNECTIONS workers this long, so a flood of idle clients delays others by at most this.
CONTROL_REQUEST_READ_S = 1.0

# The CLI (`status`, `weight`, `stop`, `logs`) retries a "busy" reply (every worker held) for this
# long: longer than CONTROL_REQUEST_READ_S, so a flood of idle connections has timed out by then;
# short enough that a sustained flood ends in one line, not a hang.
CONTROL_BUSY_RETRY_S = 5.0
CONTROL_BUSY_BACKOFF_FIRST_S = 0.05  # the first wait before a retry; doubled each time
CONTROL_BUSY_BACKOFF_MAX_S = 0.5  # no wait longer than this: the flood may clear at any moment
