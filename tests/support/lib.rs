//! Test support shared by the conformance, escape and end-to-end suites.
