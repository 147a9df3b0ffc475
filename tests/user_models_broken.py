"""A user's module that fails as it is imported (tests/test_user_model.py)."""

raise ImportError("this module needs torch_cluster")
