"""Readers that turn a machine description (command output, sysfs, XML) into a `Topology`."""
