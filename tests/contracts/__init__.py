"""What the decode and encode commands promise: exit codes, no lost data, signals, full disks, streams, bad input."""
