"""`gpushare-tui up FILE`: engines declared in one TOML file, owned by one process
(config model in `config`, the owner loop in `owner`)."""
