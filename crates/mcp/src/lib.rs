//! `cordon-mcp`: Cordon's Model Context Protocol server exposing the sandboxed tools.
#![warn(missing_docs)]
