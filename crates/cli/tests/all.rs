//! Integration tests of the `cordon` binary: one test binary, one module per area.

mod mcp;
