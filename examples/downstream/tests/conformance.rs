//! The whole Concord suite on `MyBackend`: this one line is the downstream API.
concord_suites::harness!(concord_example_downstream::MyBackend, name = "mine");
