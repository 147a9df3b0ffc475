"""Bounds on machine descriptions and other structured inputs, shared by their readers."""

#: Deeper nesting than this is not a machine description, calibration or price table (NCCL trees are
#: < 10 levels, hwloc < 30, a profile < 6); the XML and YAML readers refuse it before recursion does.
MAX_DEPTH = 200
