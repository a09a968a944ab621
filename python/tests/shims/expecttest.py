"""Stand-in for the `expecttest` package (not in Debian 12), which torch.testing._internal.common_utils
imports for its TestCase base class. The distributed test-suite uses no expect-test feature, so the
base class is plain unittest.TestCase; the one expect-test assertion fails loudly if ever reached."""
import unittest

ACCEPT = False  # common_utils reads it (expecttest: rewrite expectations in place)


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (expecttest's name)
        raise NotImplementedError("expecttest stand-in: assertExpectedInline is not available")
