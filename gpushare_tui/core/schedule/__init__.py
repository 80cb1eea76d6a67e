"""Pure rules, no I/O, the clock passed in: the v1 schedule (spec §5) and Extension 1 (§7).
Imports only core/registry (the ABI) and core/host."""
