"""The one compiled part: the front proxy's per-token relay (gpushare_tui/core/engines/_relay.c). Optional: where
it cannot be built (no C compiler), the install goes on and the proxy relays in Python (docs/pacing.md)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpushare_tui.core.engines._relay",
            # picohttpparser (h2o/picohttpparser f832609, MIT): the engine's response heads the relay reads
            sources=["gpushare_tui/core/engines/_relay.c", "gpushare_tui/core/engines/picohttpparser.c"],
            depends=["gpushare_tui/core/engines/picohttpparser.h"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        )
    ]
)
