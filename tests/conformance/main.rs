//! The cross-backend conformance suite: ONE set of tool-behaviour tests, instantiated for every
//! backend by [`conformance_tests!`]. `cargo test -p cordon-tests --test conformance local::`
//! runs one backend.
//!
//! Every case drives the whole pipeline through a `cordon_runtime::Session` (prepare, validate,
//! policy, execute, after hooks) over a fresh workspace (see `cordon_tests::Workspace`), and
//! compares exact outputs after replacing the backend's workspace root with `$ROOT`. A case
//! that passes on one backend and fails on another has found a bug.
//!
//! Adding a backend: implement `cordon_tests::Harness` for it, then add one line
//! `conformance_tests!(name, factory_expression);` below.

mod cases;

use std::sync::Arc;

use cordon_tests::Harness;

/// The harness for a test, or `None` (with a note on stderr) when the user opted this backend
/// out explicitly.
fn start(harness: impl Harness) -> Option<Arc<dyn Harness>> {
    if let Some(reason) = harness.opted_out() {
        eprintln!("{} backend not tested: {reason}", harness.name());
        return None;
    }
    Some(Arc::new(harness))
}

/// `conformance_tests!(backend, harness)`: a module `backend` with one test per case, named
/// `backend::group::case`.
macro_rules! conformance_tests {
    ($backend:ident, $harness:expr) => {
        mod $backend {
            conformance_tests!(@groups $harness;
                read: [
                    whole_file,
                    offset_and_limit,
                    truncated_by_lines,
                    truncated_by_bytes,
                    trailing_newline_is_not_a_line,
                    overlong_first_line_hint,
                    offset_beyond_end,
                    missing_file,
                    directory,
                    image_by_magic_bytes,
                    bmp_is_converted_to_png,
                    image_extension_with_text_is_text,
                    binary_file_note,
                    lenient_argument_coercion,
                ],
                write: [
                    creates_parent_directories,
                    reports_utf8_byte_count,
                    overwrite_keeps_permissions,
                    read_only_file_and_directory,
                    full_disk_keeps_the_old_file,
                ],
                edit: [
                    replaces_and_reports_diff,
                    multiple_disjoint_edits,
                    edits_match_the_original,
                    text_not_found,
                    duplicate_text,
                    missing_file,
                    all_or_nothing,
                    preserves_crlf_and_bom,
                    legacy_arguments,
                    through_symlink_inside_workspace,
                    read_only_file,
                ],
                ls: [
                    sorted_with_directory_slashes,
                    limit_notice,
                    missing_and_not_a_directory,
                    write_temp_files_are_hidden,
                ],
                grep: [
                    matches_across_files,
                    context_and_limit,
                    single_file_uses_basename,
                    gitignore_and_git_excluded,
                    no_matches_and_flag_like_pattern,
                    invalid_regex,
                    write_temp_files_are_not_searched,
                ],
                find: [
                    hidden_files_gitignore_and_git_excluded,
                    limit_notice,
                    no_files_and_invalid_glob,
                    control_characters_in_names_are_escaped,
                    write_temp_files_are_not_found,
                ],
                bash: [
                    merged_output_and_structured_content,
                    no_output,
                    runs_in_workspace_root,
                    exit_code,
                    killed_by_signal,
                    strips_ansi_and_control_characters,
                    file_changes_visible_to_file_tools,
                    timeout_kills_process_tree,
                    cancel_kills_process_tree,
                    spill_file_readable_with_read,
                    spill_file_on_error_result,
                    invalid_timeout,
                    streams_partial_updates,
                    timeout_clamped_to_policy_maximum,
                ],
                pipeline: [
                    unknown_tool,
                    validation_error,
                    parallel_edits_to_one_file_both_land,
                    queue_keeps_call_order,
                    parallel_end_events_in_completion_order,
                    sequential_mode_runs_one_at_a_time,
                    length_stop_executes_nothing,
                    cancelled_batch_gives_every_call_a_result,
                ],
                policy: [
                    disabled_tool_is_not_found,
                    denied_tool_rule,
                    denied_path_rule,
                    denied_filesystem_glob,
                    bash_command_rule,
                    ask_without_approver_is_denied,
                    protected_git_config,
                    redacts_secret_in_bash_output,
                    audit_log_records_decisions,
                ],
                confinement: [
                    dotdot_escape,
                    absolute_path_outside,
                    symlink_file_out,
                    symlink_directory_out,
                    symlink_inside_is_followed,
                ],
            );
        }
    };
    (@groups $harness:expr; $($group:ident: [$($case:ident),* $(,)?]),* $(,)?) => {
        $(
            mod $group {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        if let Some(harness) = crate::start($harness) {
                            crate::cases::$group::$case(harness).await;
                        }
                    }
                )*
            }
        )*
    };
}

conformance_tests!(local, cordon_tests::Local);
conformance_tests!(docker, cordon_tests::Docker);
conformance_tests!(docker_helper, cordon_tests::DockerHelper);
conformance_tests!(ssh, cordon_tests::Ssh);
conformance_tests!(helper_pipe, cordon_tests::HelperPipe);
conformance_tests!(ssh_helper, cordon_tests::SshHelper);

/// `host_workspace_tests!(backend, harness)`: cases about what host programs find in the
/// workspace after a session, for the backends whose workspace is on this host. (An SSH
/// workspace is on the remote host, where Cordon does not sweep yet.)
macro_rules! host_workspace_tests {
    ($backend:ident, $harness:expr) => {
        mod $backend {
            conformance_tests!(@groups $harness;
                git_metadata: [
                    nested_repository_config_does_not_run_on_the_host,
                    bare_repository_in_the_root_does_not_run_on_the_host,
                    hooks_path_of_a_nested_repository_does_not_run_on_commit,
                    file_tools_refuse_nested_git_metadata,
                    operator_nested_repository_is_kept_usable_and_read_only,
                    allowed_nested_repository_is_kept,
                    layout_with_executable_files_for_objects_and_refs_is_quarantined,
                    hooks_path_in_the_workspace_is_read_only,
                ],
            );
        }
    };
}

/// `sandboxed_tests!(backend, harness)`: failed commands explained against the sandbox, for
/// the backends that run commands in one. (The SSH backend runs commands only with
/// `allow_degraded` and no sandbox: nothing there is explained, see `without_sandbox`.)
macro_rules! sandboxed_tests {
    ($backend:ident, $harness:expr) => {
        mod $backend {
            conformance_tests!(@groups $harness;
                denials: [
                    protected_path,
                    read_only_path,
                    denied_path,
                    denied_contents_do_not_change_the_note,
                    network_off,
                    timeout,
                    file_size,
                    memory,
                    pids,
                ],
            );
        }
    };
}

mod sandboxed {
    sandboxed_tests!(local, cordon_tests::Local);
    sandboxed_tests!(docker, cordon_tests::Docker);
    sandboxed_tests!(docker_helper, cordon_tests::DockerHelper);
    sandboxed_tests!(helper_pipe, cordon_tests::HelperPipe);
    sandboxed_tests!(ssh_helper, cordon_tests::SshHelper);
}

/// Explanations that depend on what only the local backend judges on the host.
mod sandboxed_local_only {
    mod local {
        conformance_tests!(@groups cordon_tests::Local;
            denials: [host_permissions_are_not_blamed_on_the_sandbox],
        );
    }
    // The helper judges them on its own host, which is this one here.
    mod helper_pipe {
        conformance_tests!(@groups cordon_tests::HelperPipe;
            denials: [host_permissions_are_not_blamed_on_the_sandbox],
        );
    }
}

mod without_sandbox {
    mod ssh {
        conformance_tests!(@groups cordon_tests::Ssh;
            denials: [nothing_is_explained_without_a_sandbox],
        );
    }
}

mod host_workspace {
    host_workspace_tests!(local, cordon_tests::Local);
    host_workspace_tests!(docker, cordon_tests::Docker);
    host_workspace_tests!(docker_helper, cordon_tests::DockerHelper);
    host_workspace_tests!(helper_pipe, cordon_tests::HelperPipe);
}
