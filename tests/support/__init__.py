"""Helpers the tests import; no tests here."""
