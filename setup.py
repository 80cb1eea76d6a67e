"""The one compiled part: the front proxy's per-token relay (gpushare_tui/core/engines/_relay.c). Optional: where
it cannot be built (no C compiler), the install goes on and the proxy relays in Python (docs/pacing.md)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpushare_tui.core.engines._relay",
            sources=["gpushare_tui/core/engines/_relay.c"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        )
    ]
)
