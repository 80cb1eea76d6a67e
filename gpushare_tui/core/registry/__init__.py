"""The shared segment (spec §1-§4): the ABI layout spelled once, segment I/O and its trust rules,
membership, ownership and gc. Imports only core/host."""
