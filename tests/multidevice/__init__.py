"""Tests on 8 simulated devices, run in their own process by tests/test_multidevice.py."""
