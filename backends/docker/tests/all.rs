//! Integration tests of the Docker backend against a real engine. The engine is found through
//! `DOCKER_HOST`/the default socket or started with `scripts/docker-start.sh`; the images are
//! built (offline, idempotent) with `scripts/build-sandbox-image.sh`. Without an engine the
//! tests FAIL, unless `CORDON_SKIP_DOCKER=1` opts out explicitly.

mod support;

mod bash;
mod commands;
mod copy;
mod egress;
mod faults;
mod files;
mod files_helper;
mod helper_copy;
mod lifecycle;
mod podman;
mod search;
mod ssh_engine;
mod tls;
mod unix_sockets;
