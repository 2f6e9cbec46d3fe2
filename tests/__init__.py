"""The test suite: one folder per package folder, the command lines' promises in contracts/, helpers in support/."""
