"""Build hook for the optional C accelerator (the delivery log's recorder); everything else is in pyproject.toml.

APPLIANCE_PURE_PYTHON=1 builds a pure-Python wheel (the SD-card image's: its arm64 tree is not this machine's).
A machine without a C compiler gets the pure-Python recorder: the extension is optional.
"""

import os

from setuptools import Extension, setup

ext_modules = []
if os.environ.get("APPLIANCE_PURE_PYTHON", "") not in ("1", "true", "yes"):
    ext_modules.append(
        Extension("appliance.deliverylog._recorder", ["appliance/deliverylog/_recorder.c"], optional=True,
                  extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"])
    )
setup(ext_modules=ext_modules)
