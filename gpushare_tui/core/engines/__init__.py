"""Supervising a process: the supervisor, the front proxy, activity and health sources, engine kinds
and declarations, spawning, the launcher, the watchdog and each kind's argv (llama-server, a
command, the synthetic engine). The top layer of core/."""
