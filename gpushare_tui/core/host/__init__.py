"""The OS layer: paths and trusted directories, budgets, lifecycle and signals, the clock, errors,
display text, log tails, local HTTP probes. The lowest layer of core/."""
