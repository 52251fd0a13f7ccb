"""Tests run on 8 simulated CPU devices, set up before anything starts JAX's backends."""

import equarx_ref as eq

DEVICES = eq.setup_devices(8)
