//! Static analysis of bash scripts for command rules: every simple command a script can run,
//! with a normalised argv, or the reason the analyser cannot see what will run.
//!
//! The script is parsed with `brush-parser` (a maintained POSIX/bash parser). The walk visits
//! every place bash can run a command: lists, pipelines, `&&`/`||`, subshells, brace groups,
//! `if`/`while`/`until`/`for`/`case` bodies, function bodies, coprocesses, `$(…)`, backticks,
//! `<(…)`/`>(…)`, substitutions nested in parameter expansions, arithmetic, redirection targets
//! and here-documents, and the strings given to `bash -c`/`sh -c`/`zsh -c`, `eval`, `trap`,
//! `su -c`, `flock -c`, `watch`, `script -c`, `sg` and `env -S` (parsed recursively,
//! depth-limited). Programs that run another program (wrappers such as `env`, `sudo`,
//! `prlimit`, `xargs`; `git -c core.pager=…`, `tar --to-command`, `find -exec`, …) are looked
//! through with the reviewed tables of the `wrappers`, `git` and `runners` modules, and
//! assignments to variables that name a program (`GIT_EXTERNAL_DIFF`, `PAGER`, …) are judged as
//! that program running (`variables` module).
//!
//! Words are resolved the way bash would before running the command: quotes removed,
//! backslash escapes and `$'…'` decoded. A word whose value is only known at run time
//! (parameter or command substitution, glob, brace expansion) is [`Word::Dynamic`]; a command
//! NAME that is dynamic makes the script unanalysable, as do `source`, `alias`, `enable`,
//! `hash -p`, `fc`, `mapfile -C`, shells reading a script file or standard input, and
//! assignments to variables that load code the analyser cannot see (`PATH`, `LD_PRELOAD`,
//! `BASH_ENV`, `PYTHONPATH`, …).
//!
//! What it cannot see (documented in policies/README.md): programs that run other programs by
//! their own means (interpreters, `make`, `npm run`), settings programs read from their own
//! files, and bash's arithmetic evaluation of variable contents. The OS sandbox is the hard
//! boundary.

mod git;
mod runners;
mod variables;
mod wrappers;

/// What the analyser tests of the table modules share.
#[cfg(test)]
mod test_support {
    use super::analyse_script;

    /// The commands `script` runs, as the rules see them.
    pub(crate) fn found(script: &str) -> Vec<String> {
        analyse_script(script)
            .commands
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Why `script` is unanalysable (empty when it is not).
    pub(crate) fn reasons(script: &str) -> String {
        analyse_script(script).unanalysable.join("; ")
    }
}

pub use wrappers::{SYSTEM_BIN_DIRS, is_system_program_path};

use std::fmt;

use brush_parser::ast;
use brush_parser::word::{self as bword, ParameterExpr, WordPiece, WordPieceWithSource};
use serde::Serialize;

/// How deep `bash -c`, `eval`, `$(…)` and friends may nest before the script is unanalysable.
pub const MAX_DEPTH: usize = 8;
/// Scripts longer than this are not analysed.
pub const MAX_SCRIPT_BYTES: usize = 1 << 20;
/// Scripts with more simple commands than this are not analysed.
pub const MAX_COMMANDS: usize = 10_000;
/// Scripts with more brackets and compound-command keywords than this (counted without
/// their closers, over the script and every script nested in it) are not analysed: the
/// parser recurses once per nesting level, and this bounds the depth it can reach.
pub const MAX_OPENERS: usize = 2_000;
/// Stack the parser and the analysis may need for [`MAX_OPENERS`] nesting levels, with a
/// wide margin even in a debug build. Each script (the top one and every nested one) is
/// parsed and walked where its own levels fit: on the caller's stack when enough is left
/// (everyday commands on a 2 MiB tokio worker), else on a fresh stack of this size
/// (reserved, only touched pages are committed).
pub const ANALYSIS_STACK_BYTES: usize = 256 << 20;
/// Steps every analysis may take, plus [`STEPS_PER_BYTE`] per byte of the script, at most
/// [`MAX_STEPS`]: a step is a token or word piece the parser tries (its grammars backtrack,
/// exponentially on unclosed constructs like `((((…` or `{a,{a,…`) or a word the analyser
/// copies while unwrapping. A script that needs more is unanalysable ("too complex"), which
/// bounds the time and memory one analysis can take.
pub const BASE_STEPS: u64 = 100_000;
/// See [`BASE_STEPS`]. Real scripts take 1–10 steps per byte (measured on the repository's
/// scripts and 60 system shell scripts, up to 28 KB).
pub const STEPS_PER_BYTE: u64 = 32;
/// See [`BASE_STEPS`].
pub const MAX_STEPS: u64 = 4_000_000;
/// How many programs may wrap one another (`env nice timeout … git`) before the command is
/// unanalysable.
pub const MAX_CHAIN: usize = 64;
/// The share of [`ANALYSIS_STACK_BYTES`] one nesting level may use (128 KiB).
const STACK_PER_LEVEL: usize = ANALYSIS_STACK_BYTES / MAX_OPENERS;

/// One word of a normalised command line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "text", rename_all = "camelCase")]
pub enum Word {
    /// The exact value bash passes to the program (quotes and escapes resolved).
    Literal(String),
    /// A value only known at run time; holds the word's source text (e.g. `$x`, `*.rs`).
    Dynamic(String),
}

impl Word {
    /// The literal value, if the word is literal.
    pub fn literal(&self) -> Option<&str> {
        match self {
            Word::Literal(text) => Some(text),
            Word::Dynamic(_) => None,
        }
    }

    fn display(&self) -> String {
        match self {
            Word::Literal(text) => quote_for_display(text),
            Word::Dynamic(source) => source.clone(),
        }
    }
}

/// One simple command the script can run, normalised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimpleCommand {
    /// Program name: the last path component of the command word (`/usr/bin/git` → `git`).
    pub program: String,
    /// The command word as written when it named a path (`/usr/bin/git`, `./git`, `~/bin/x`).
    pub program_path: Option<String>,
    /// Arguments after the program.
    pub args: Vec<Word>,
    /// More arguments are appended at run time (e.g. by `xargs`).
    pub open_tail: bool,
    /// What runs this command, outermost first (`prlimit`, `bash -c`, `env var GIT_PAGER`,
    /// `git setting core.pager`); empty when the script runs it directly.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub via: Vec<String>,
}

impl SimpleCommand {
    /// All argv words, the program first.
    pub fn argv(&self) -> Vec<Word> {
        let mut argv = Vec::with_capacity(self.args.len() + 1);
        argv.push(Word::Literal(self.program.clone()));
        argv.extend(self.args.iter().cloned());
        argv
    }
}

impl SimpleCommand {
    /// The command with what runs it: `prlimit → git push`.
    pub fn chain(&self) -> String {
        let mut out = String::new();
        for step in &self.via {
            out.push_str(step);
            out.push_str(" → ");
        }
        out.push_str(&self.to_string());
        out
    }
}

impl fmt::Display for SimpleCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let program = self.program_path.as_deref().unwrap_or(&self.program);
        f.write_str(&quote_for_display(program))?;
        for arg in &self.args {
            write!(f, " {}", arg.display())?;
        }
        if self.open_tail {
            f.write_str(" …")?;
        }
        Ok(())
    }
}

/// What a script can run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScriptAnalysis {
    /// Every simple command found, in source order (nested ones after their container).
    pub commands: Vec<SimpleCommand>,
    /// Why parts of the script cannot be analysed; empty when the analysis is complete.
    pub unanalysable: Vec<String>,
    /// Steps of the budget the analysis used (see [`BASE_STEPS`]).
    #[serde(skip)]
    pub steps: u64,
}

impl ScriptAnalysis {
    /// Whether every command the script can run is in [`ScriptAnalysis::commands`].
    pub fn is_complete(&self) -> bool {
        self.unanalysable.is_empty()
    }
}

/// The step budget [`analyse_script`] gives a script of `len` bytes.
pub fn step_budget(len: usize) -> u64 {
    BASE_STEPS
        .saturating_add(STEPS_PER_BYTE.saturating_mul(len as u64))
        .min(MAX_STEPS)
}

/// Analyse a bash script, within the step budget for its size ([`step_budget`]).
pub fn analyse_script(script: &str) -> ScriptAnalysis {
    analyse_script_within(script, step_budget(script.len()))
}

/// Analyse a bash script within `steps` (see [`BASE_STEPS`]). When they run out the analysis
/// stops: the commands found so far are kept (a deny rule still matches them) and the script
/// is unanalysable as too complex.
pub fn analyse_script_within(script: &str, steps: u64) -> ScriptAnalysis {
    let budget = brush_parser::budget::Budget::start(steps);
    let mut analyser = Analyser::default();
    analyser.script(script, 0);
    let mut out = analyser.out;
    if brush_parser::budget::exhausted() {
        // What failed after the budget ran out failed because of it.
        out.unanalysable = vec![format!(
            "the script is too complex to analyse (it needs more than {steps} parser steps); split it into simpler commands"
        )];
    }
    out.steps = steps - brush_parser::budget::remaining();
    drop(budget);
    out
}

/// A word after expansion analysis, before it becomes an argv [`Word`].
#[derive(Clone, Debug)]
struct Expanded {
    /// Literal value, or the source text when dynamic.
    text: String,
    dynamic: bool,
}

impl Expanded {
    fn into_word(self) -> Word {
        if self.dynamic {
            Word::Dynamic(self.text)
        } else {
            Word::Literal(self.text)
        }
    }
}

#[derive(Default)]
struct Analyser {
    out: ScriptAnalysis,
    /// The texts being parsed, innermost last (source spans index into them).
    sources: Vec<String>,
    /// Openers counted so far (see [`MAX_OPENERS`]).
    openers: usize,
    /// What runs the commands being analysed (see [`SimpleCommand::via`]).
    via: Vec<String>,
}

impl Analyser {
    fn opaque(&mut self, reason: impl Into<String>) {
        let reason = reason.into();
        if !self.out.unanalysable.contains(&reason) {
            self.out.unanalysable.push(reason);
        }
    }

    /// Analyse what `step` runs: commands recorded inside carry it in their chain.
    fn within<R>(&mut self, step: String, inside: impl FnOnce(&mut Self) -> R) -> R {
        self.via.push(step);
        let result = inside(self);
        self.via.pop();
        result
    }

    fn script(&mut self, text: &str, depth: usize) {
        if brush_parser::budget::exhausted() {
            return;
        }
        if depth > MAX_DEPTH {
            self.opaque(format!(
                "commands are nested more than {MAX_DEPTH} levels deep (bash -c, eval, $(…))"
            ));
            return;
        }
        if text.len() > MAX_SCRIPT_BYTES {
            self.opaque(format!(
                "the script is longer than {MAX_SCRIPT_BYTES} bytes"
            ));
            return;
        }
        let openers = opener_count(text);
        self.openers += openers;
        if self.openers > MAX_OPENERS {
            self.opaque(format!(
                "the script has more than {MAX_OPENERS} brackets and compound commands"
            ));
            return;
        }
        // Parsing and walking this text recurse once per nesting level: run them where
        // that many levels (plus two of margin) fit.
        let needed = (openers + 2) * STACK_PER_LEVEL;
        stacker::maybe_grow(needed, ANALYSIS_STACK_BYTES.max(needed), || {
            self.parse_and_walk(text, depth);
        });
    }

    fn parse_and_walk(&mut self, text: &str, depth: usize) {
        let options = parser_options();
        let mut parser =
            brush_parser::Parser::new(std::io::BufReader::new(text.as_bytes()), &options);
        match parser.parse_program() {
            Ok(program) => {
                self.sources.push(text.to_owned());
                for list in &program.complete_commands {
                    self.compound_list(list, depth);
                }
                self.sources.pop();
            }
            Err(error) => self.opaque(format!("failed to parse the script: {error}")),
        }
    }

    /// The text a source span of the innermost script covers (spans count characters).
    fn source_text(&self, span: &brush_parser::SourceSpan) -> Option<String> {
        let text = self.sources.last()?;
        let start = span.start.index;
        let end = span.end.index;
        if end < start {
            return None;
        }
        let slice: String = text.chars().skip(start).take(end - start).collect();
        (slice.chars().count() == end - start).then_some(slice)
    }

    fn compound_list(&mut self, list: &ast::CompoundList, depth: usize) {
        for ast::CompoundListItem(and_or, _separator) in &list.0 {
            self.pipeline(&and_or.first, depth);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(pipeline) | ast::AndOr::Or(pipeline) => {
                        self.pipeline(pipeline, depth)
                    }
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline, depth: usize) {
        for command in &pipeline.seq {
            self.command(command, depth);
        }
    }

    fn command(&mut self, command: &ast::Command, depth: usize) {
        match command {
            ast::Command::Simple(simple) => self.simple(simple, depth),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound, depth);
                self.redirect_list(redirects.as_ref(), depth);
            }
            ast::Command::Function(function) => {
                let ast::FunctionBody(body, redirects) = &function.body;
                self.compound(body, depth);
                self.redirect_list(redirects.as_ref(), depth);
            }
            ast::Command::ExtendedTest(test, redirects) => {
                self.extended_test(&test.expr, depth);
                self.redirect_list(redirects.as_ref(), depth);
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand, depth: usize) {
        match compound {
            ast::CompoundCommand::Arithmetic(arithmetic) => {
                // brush reads `( (cmd) )` and `((a)&&(b))` as arithmetic; bash runs them as
                // nested subshells. Decide with bash's rule on the source text.
                match self.source_text(&arithmetic.loc) {
                    Some(text) if dparen_is_arithmetic(&text) => {
                        self.nested_text(&arithmetic.expr.value, depth)
                    }
                    Some(text) => match text.get(1..text.len().saturating_sub(1)) {
                        Some(inner) if text.len() >= 2 => self.script(inner, depth + 1),
                        Some(_) | None => {
                            self.opaque("failed to read a `((…))` command of the script")
                        }
                    },
                    None => self.opaque("failed to read a `((…))` command of the script"),
                }
            }
            ast::CompoundCommand::ArithmeticForClause(clause) => {
                for expr in [&clause.initializer, &clause.condition, &clause.updater]
                    .into_iter()
                    .flatten()
                {
                    self.nested_text(&expr.value, depth);
                }
                self.compound_list(&clause.body.list, depth);
            }
            ast::CompoundCommand::BraceGroup(group) => self.compound_list(&group.list, depth),
            ast::CompoundCommand::Subshell(subshell) => self.compound_list(&subshell.list, depth),
            ast::CompoundCommand::ForClause(clause) => {
                for value in clause.values.iter().flatten() {
                    self.expand(&value.value, depth);
                }
                self.compound_list(&clause.body.list, depth);
            }
            ast::CompoundCommand::CaseClause(clause) => {
                self.expand(&clause.value.value, depth);
                for item in &clause.cases {
                    for pattern in &item.patterns {
                        self.expand(&pattern.value, depth);
                    }
                    if let Some(body) = &item.cmd {
                        self.compound_list(body, depth);
                    }
                }
            }
            ast::CompoundCommand::IfClause(clause) => {
                self.compound_list(&clause.condition, depth);
                self.compound_list(&clause.then, depth);
                for else_clause in clause.elses.iter().flatten() {
                    if let Some(condition) = &else_clause.condition {
                        self.compound_list(condition, depth);
                    }
                    self.compound_list(&else_clause.body, depth);
                }
            }
            ast::CompoundCommand::WhileClause(clause)
            | ast::CompoundCommand::UntilClause(clause) => {
                let ast::WhileOrUntilClauseCommand(condition, body, _span) = clause;
                self.compound_list(condition, depth);
                self.compound_list(&body.list, depth);
            }
            ast::CompoundCommand::Coprocess(coprocess) => self.command(&coprocess.body, depth),
        }
    }

    fn extended_test(&mut self, expr: &ast::ExtendedTestExpr, depth: usize) {
        match expr {
            ast::ExtendedTestExpr::And(left, right) | ast::ExtendedTestExpr::Or(left, right) => {
                self.extended_test(left, depth);
                self.extended_test(right, depth);
            }
            ast::ExtendedTestExpr::Not(inner) | ast::ExtendedTestExpr::Parenthesized(inner) => {
                self.extended_test(inner, depth)
            }
            ast::ExtendedTestExpr::UnaryTest(_, word) => {
                let operand = self.expand(&word.value, depth);
                self.test_operand(&operand);
            }
            ast::ExtendedTestExpr::BinaryTest(_, left, right) => {
                let left = self.expand(&left.value, depth);
                self.test_operand(&left);
                let right = self.expand(&right.value, depth);
                self.test_operand(&right);
            }
        }
    }

    /// `[[ -v 'a[$(cmd)]' ]]` and arithmetic comparisons evaluate subscripts in literal text.
    fn test_operand(&mut self, operand: &Expanded) {
        if !operand.dynamic && evaluates_subscript(&operand.text) {
            self.opaque(format!(
                "`[[ … {} … ]]` names an array element whose subscript bash evaluates, running the commands in it",
                quote_for_display(&operand.text)
            ));
        }
    }

    fn redirect_list(&mut self, redirects: Option<&ast::RedirectList>, depth: usize) {
        for redirect in redirects.iter().flat_map(|list| list.0.iter()) {
            self.redirect(redirect, depth);
        }
    }

    fn redirect(&mut self, redirect: &ast::IoRedirect, depth: usize) {
        match redirect {
            ast::IoRedirect::File(_, _, target) => match target {
                ast::IoFileRedirectTarget::Filename(word)
                | ast::IoFileRedirectTarget::Duplicate(word) => {
                    self.expand(&word.value, depth);
                }
                ast::IoFileRedirectTarget::Fd(_) => {}
                ast::IoFileRedirectTarget::ProcessSubstitution(_, subshell) => {
                    self.compound_list(&subshell.list, depth)
                }
            },
            ast::IoRedirect::HereDocument(_, heredoc) => {
                if heredoc.requires_expansion {
                    match bword::parse_heredoc(&heredoc.doc.value, &parser_options()) {
                        Ok(pieces) => {
                            let mut sink = Expanded {
                                text: String::new(),
                                dynamic: false,
                            };
                            self.pieces(&pieces, true, &mut sink, depth);
                        }
                        Err(error) => {
                            self.opaque(format!("failed to parse a here-document: {error}"))
                        }
                    }
                }
            }
            ast::IoRedirect::HereString(_, word) | ast::IoRedirect::OutputAndError(word, _) => {
                self.expand(&word.value, depth);
            }
        }
    }

    /// The variable an assignment sets (array indices are scanned for substitutions).
    fn assignment_target<'a>(&mut self, name: &'a ast::AssignmentName, depth: usize) -> &'a str {
        match name {
            ast::AssignmentName::VariableName(name) => name,
            ast::AssignmentName::ArrayElementName(name, index) => {
                self.nested_text(index, depth);
                name
            }
        }
    }

    fn assignment(&mut self, assignment: &ast::Assignment, depth: usize) {
        let name = self.assignment_target(&assignment.name, depth);
        match &assignment.value {
            ast::AssignmentValue::Scalar(word) => {
                let value = self.expand(&word.value, depth);
                let value = (!value.dynamic).then_some(value.text);
                self.check_assignment(name, value.as_deref(), depth);
            }
            ast::AssignmentValue::Array(elements) => {
                for (key, value) in elements {
                    if let Some(key) = key {
                        self.expand(&key.value, depth);
                    }
                    self.expand(&value.value, depth);
                }
                self.check_assignment(name, None, depth);
            }
        }
    }

    /// Judge assigning `value` to `name` (`None`: only known at run time): a variable whose
    /// value is a command line is analysed as that command running; one that loads code the
    /// analyser cannot see makes the script unanalysable.
    fn check_assignment(&mut self, name: &str, value: Option<&str>, depth: usize) {
        if let Some(value) = value.filter(|value| evaluates_subscript(value)) {
            // Arithmetic on the variable later (`$((x))`, `declare -i`) would run it.
            self.opaque(format!(
                "the script assigns {name} the text {}, whose array subscript bash runs when the variable is used in arithmetic",
                quote_for_display(value)
            ));
        }
        match (variables::effect(name), value) {
            (variables::Effect::Inert, _) => {}
            (variables::Effect::Opaque, _) => self.opaque(format!(
                "the script assigns {name}, which changes which programs run or what they execute"
            )),
            (variables::Effect::Command, Some(value)) => {
                let line = variables::command_line(name, value);
                if !line.trim().is_empty() {
                    self.within(format!("env var {name}"), |analyser| {
                        analyser.script(&line, depth + 1)
                    });
                }
            }
            (variables::Effect::GitKey, Some(key)) if !variables::git_key_runs_program(key) => {}
            (variables::Effect::GitKey, Some(key)) => self.opaque(format!(
                "the script sets the git setting {key} through {name}, which makes git run a program; pass it with `git -c {key}=…` instead"
            )),
            (variables::Effect::Command | variables::Effect::GitKey, None) => self.opaque(format!(
                "the script assigns {name} a value only known at run time, and {name} names a program that runs"
            )),
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand, depth: usize) {
        let mut argv: Vec<Expanded> = Vec::new();
        for item in simple.prefix.iter().flat_map(|prefix| prefix.0.iter()) {
            self.command_item(item, true, &mut argv, depth);
        }
        if let Some(name) = &simple.word_or_name {
            argv.push(self.expand(&name.value, depth));
        }
        for item in simple.suffix.iter().flat_map(|suffix| suffix.0.iter()) {
            self.command_item(item, false, &mut argv, depth);
        }
        let argv: Vec<Word> = argv.into_iter().map(Expanded::into_word).collect();
        self.run(argv, depth);
    }

    fn command_item(
        &mut self,
        item: &ast::CommandPrefixOrSuffixItem,
        in_prefix: bool,
        argv: &mut Vec<Expanded>,
        depth: usize,
    ) {
        match item {
            ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => self.redirect(redirect, depth),
            ast::CommandPrefixOrSuffixItem::Word(word) => {
                argv.push(self.expand(&word.value, depth))
            }
            ast::CommandPrefixOrSuffixItem::AssignmentWord(assignment, word) => {
                if in_prefix {
                    self.assignment(assignment, depth);
                } else {
                    // `export NAME=value`, `declare NAME=value`: an argument of the builtin;
                    // expanding the whole word finds the value's substitutions once. A
                    // literal value is judged when the builtin is recorded.
                    let name = self.assignment_target(&assignment.name, depth);
                    let expanded = self.expand(&word.value, depth);
                    if expanded.dynamic {
                        self.check_assignment(name, None, depth);
                    }
                    argv.push(expanded);
                }
            }
            ast::CommandPrefixOrSuffixItem::ProcessSubstitution(_, subshell) => {
                self.compound_list(&subshell.list, depth);
                argv.push(Expanded {
                    text: "<(…)".to_owned(),
                    dynamic: true,
                });
            }
        }
    }

    /// Normalise and record one command line (wrappers stripped, nested scripts parsed).
    fn run(&mut self, argv: Vec<Word>, depth: usize) {
        self.run_with_tail(argv, false, depth);
    }

    fn run_with_tail(&mut self, argv: Vec<Word>, open_tail: bool, depth: usize) {
        // Unwrapping copies the words once per wrapper: charge them. Without steps left the
        // command is still recorded as written (a deny rule may match it), not unwrapped.
        let unwrap = brush_parser::budget::charge(argv.len() as u64 + 1);
        if self.via.len() >= MAX_CHAIN {
            self.opaque(format!(
                "more than {MAX_CHAIN} programs run one another around one command"
            ));
            return;
        }
        if self.out.commands.len() >= MAX_COMMANDS {
            self.opaque(format!("the script has more than {MAX_COMMANDS} commands"));
            return;
        }
        let Some(first) = argv.first() else {
            return;
        };
        let name = match first {
            Word::Literal(name) => name.clone(),
            Word::Dynamic(source) => {
                self.opaque(format!(
                    "the command name `{source}` is computed at run time; write the program name literally"
                ));
                return;
            }
        };
        let (program, program_path) = match name.rfind('/') {
            Some(index) => (name[index + 1..].to_owned(), Some(name.clone())),
            None => (name.clone(), None),
        };
        let args = argv[1..].to_vec();
        let command = SimpleCommand {
            program,
            program_path,
            args,
            open_tail,
            via: Vec::new(),
        };
        if unwrap {
            wrappers::normalise(self, command, depth);
        } else {
            self.record(command, depth);
        }
    }

    fn record(&mut self, mut command: SimpleCommand, depth: usize) {
        if SUBSCRIPT_BUILTINS.contains(&command.program.as_str()) {
            for arg in &command.args {
                if let Some(text) = arg.literal().filter(|text| evaluates_subscript(text)) {
                    self.opaque(format!(
                        "`{} {}` names an array element whose subscript bash evaluates, running the commands in it; use a plain variable name",
                        command.program,
                        quote_for_display(text)
                    ));
                }
            }
        }
        // Builtins that set variables named by their arguments.
        let literals: Vec<String> = command
            .args
            .iter()
            .filter_map(Word::literal)
            .map(str::to_owned)
            .collect();
        match command.program.as_str() {
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                // `export PATH` alone exports the current value: harmless.
                for text in &literals {
                    if let Some((name, value)) = text.split_once('=') {
                        self.check_assignment(name.trim_end_matches('+'), Some(value), depth);
                    }
                }
            }
            "read" | "mapfile" | "readarray" | "getopts" => {
                for text in literals.iter().filter(|text| !text.starts_with('-')) {
                    self.check_assignment(text, None, depth);
                }
            }
            "printf" => {
                for pair in literals.windows(2) {
                    if pair[0] == "-v" {
                        self.check_assignment(&pair[1], None, depth);
                    }
                }
                for text in &literals {
                    if let Some(name) = text.strip_prefix("-v").filter(|name| !name.is_empty()) {
                        self.check_assignment(name, None, depth);
                    }
                }
            }
            _ => {}
        }
        if command.via.is_empty() {
            command.via = self.via.clone();
        }
        self.out.commands.push(command);
    }

    /// Analyse a word: find nested commands, resolve its value.
    fn expand(&mut self, text: &str, depth: usize) -> Expanded {
        match bword::parse(text, &parser_options()) {
            Ok(pieces) => {
                let mut result = Expanded {
                    text: String::new(),
                    dynamic: false,
                };
                self.pieces(&pieces, false, &mut result, depth);
                if result.dynamic {
                    result.text = text.to_owned();
                } else if has_unquoted_brace(&pieces) && is_brace_expansion(text) {
                    result.text = text.to_owned();
                    result.dynamic = true;
                }
                result
            }
            Err(error) => {
                self.opaque(format!("failed to parse the word `{text}`: {error}"));
                Expanded {
                    text: text.to_owned(),
                    dynamic: true,
                }
            }
        }
    }

    /// Scan text that bash expands (parameter-expansion operands, arithmetic, array indices)
    /// for command substitutions; its value does not matter.
    fn nested_text(&mut self, text: &str, depth: usize) {
        if text.contains("$(") || text.contains('`') || text.contains("<(") || text.contains(">(") {
            self.expand(text, depth);
        }
    }

    fn pieces(
        &mut self,
        pieces: &[WordPieceWithSource],
        quoted: bool,
        out: &mut Expanded,
        depth: usize,
    ) {
        for piece in pieces {
            match &piece.piece {
                WordPiece::Text(text) => {
                    if !quoted && has_glob(text) {
                        out.dynamic = true;
                    }
                    out.text.push_str(text);
                }
                WordPiece::SingleQuotedText(text) => out.text.push_str(text),
                WordPiece::AnsiCQuotedText(text) => out.text.push_str(&decode_ansi_c(text)),
                WordPiece::DoubleQuotedSequence(inner) => self.pieces(inner, true, out, depth),
                WordPiece::GettextDoubleQuotedSequence(inner) => {
                    // `$"…"` may be replaced by a translation catalogue at run time.
                    out.dynamic = true;
                    self.pieces(inner, true, out, depth);
                }
                WordPiece::TildeExpansion(tilde) => out.text.push_str(&tilde_text(tilde)),
                WordPiece::ParameterExpansion(expr) => {
                    out.dynamic = true;
                    self.parameter(expr, depth);
                }
                WordPiece::CommandSubstitution(script) => {
                    out.dynamic = true;
                    self.script(script, depth + 1);
                }
                WordPiece::BackquotedCommandSubstitution(script) => {
                    out.dynamic = true;
                    self.script(&unescape_backquoted(script), depth + 1);
                }
                WordPiece::EscapeSequence(sequence) => {
                    out.text.push_str(&unescape(sequence, quoted));
                }
                WordPiece::ArithmeticExpression(expr) => {
                    out.dynamic = true;
                    self.nested_text(&expr.value, depth);
                }
            }
        }
    }

    fn parameter(&mut self, expr: &ParameterExpr, depth: usize) {
        let mut texts: Vec<&str> = Vec::new();
        // Texts bash evaluates as arithmetic after removing quotes.
        let mut arithmetic: Vec<&str> = Vec::new();
        let parameter = match expr {
            ParameterExpr::Parameter { parameter, .. }
            | ParameterExpr::ParameterLength { parameter, .. }
            | ParameterExpr::Transform { parameter, .. } => Some(parameter),
            ParameterExpr::UseDefaultValues {
                parameter,
                default_value,
                ..
            }
            | ParameterExpr::AssignDefaultValues {
                parameter,
                default_value,
                ..
            } => {
                texts.extend(default_value.as_deref());
                Some(parameter)
            }
            ParameterExpr::IndicateErrorIfNullOrUnset {
                parameter,
                error_message,
                ..
            } => {
                texts.extend(error_message.as_deref());
                Some(parameter)
            }
            ParameterExpr::UseAlternativeValue {
                parameter,
                alternative_value,
                ..
            } => {
                texts.extend(alternative_value.as_deref());
                Some(parameter)
            }
            ParameterExpr::RemoveSmallestSuffixPattern {
                parameter, pattern, ..
            }
            | ParameterExpr::RemoveLargestSuffixPattern {
                parameter, pattern, ..
            }
            | ParameterExpr::RemoveSmallestPrefixPattern {
                parameter, pattern, ..
            }
            | ParameterExpr::RemoveLargestPrefixPattern {
                parameter, pattern, ..
            }
            | ParameterExpr::UppercaseFirstChar {
                parameter, pattern, ..
            }
            | ParameterExpr::UppercasePattern {
                parameter, pattern, ..
            }
            | ParameterExpr::LowercaseFirstChar {
                parameter, pattern, ..
            }
            | ParameterExpr::LowercasePattern {
                parameter, pattern, ..
            } => {
                texts.extend(pattern.as_deref());
                Some(parameter)
            }
            ParameterExpr::Substring {
                parameter,
                offset,
                length,
                ..
            } => {
                texts.push(&offset.value);
                arithmetic.push(&offset.value);
                if let Some(length) = length {
                    texts.push(&length.value);
                    arithmetic.push(&length.value);
                }
                Some(parameter)
            }
            ParameterExpr::ReplaceSubstring {
                parameter,
                pattern,
                replacement,
                ..
            } => {
                texts.push(pattern);
                texts.extend(replacement.as_deref());
                Some(parameter)
            }
            ParameterExpr::VariableNames { .. } | ParameterExpr::MemberKeys { .. } => None,
        };
        if let Some(bword::Parameter::NamedWithIndex { index, .. }) = parameter {
            texts.push(index);
            arithmetic.push(index);
        }
        // `${a['$(cmd)']}`, `${s:'a[$(cmd)]'}`: quoting hides the substitution from word
        // expansion, and the arithmetic evaluation after quote removal runs it.
        for text in arithmetic {
            if text.contains(['\'', '"', '\\'])
                && (text.contains("$(") || text.contains('`') || text.contains("${"))
            {
                self.opaque(format!(
                    "the subscript or offset `{text}` holds quoted substitutions that bash runs when it evaluates it as arithmetic"
                ));
            }
        }
        for text in texts {
            self.nested_text(text, depth);
        }
    }
}

/// Builtins that take variable names (or arithmetic) in their arguments. Bash evaluates an
/// array subscript in such a name as arithmetic, and arithmetic runs `$(…)` found in the text
/// even when the word was quoted: `test -v 'a[$(git push)]'`, `printf -v 'a[$(…)]' x`.
const SUBSCRIPT_BUILTINS: &[&str] = &[
    "test",
    "[",
    "printf",
    "read",
    "declare",
    "typeset",
    "local",
    "export",
    "readonly",
    "unset",
    "let",
    "mapfile",
    "readarray",
    "getopts",
    "wait",
    "shift",
    "return",
    "exit",
    "ulimit",
];

/// Whether `text` holds a `[…]` with a command or parameter substitution after its `[` that
/// arithmetic evaluation would run.
fn evaluates_subscript(text: &str) -> bool {
    text.find('[').is_some_and(|open| {
        let inside = &text[open..];
        inside.contains("$(") || inside.contains('`') || inside.contains("${")
    })
}

/// An upper bound of the parser's nesting for `text`: every bracket outside single quotes
/// and every compound-command keyword opens a level; closers are not trusted (a here-document
/// or a quoted string may hold them), so nothing is subtracted.
fn opener_count(text: &str) -> usize {
    let mut count = 0usize;
    let mut word = String::new();
    let mut chars = text.chars();
    let keyword = |word: &mut String| {
        let opens = matches!(
            word.as_str(),
            "if" | "case" | "while" | "until" | "for" | "select"
        );
        word.clear();
        usize::from(opens)
    };
    while let Some(c) = chars.next() {
        if c.is_ascii_alphabetic() {
            word.push(c);
            continue;
        }
        count += keyword(&mut word);
        match c {
            '\\' => {
                chars.next();
            }
            '\'' => {
                for next in chars.by_ref() {
                    if next == '\'' {
                        break;
                    }
                }
            }
            '(' | '{' | '[' => count += 1,
            _ => {}
        }
    }
    count + keyword(&mut word)
}

/// bash's rule for `((`: arithmetic only if the parenthesis opened second is closed by a
/// `)` immediately followed by the final `)`; otherwise the text is nested subshells.
fn dparen_is_arithmetic(text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() < 4 || chars[0] != '(' || chars[1] != '(' {
        return false;
    }
    match matching_paren(&chars, 1) {
        Some(close) => close + 2 == chars.len() && chars[close + 1] == ')',
        None => false,
    }
}

/// Index of the `)` matching the `(` at `open`, skipping quoted text and escapes.
fn matching_paren(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '\'' => {
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn parser_options() -> brush_parser::ParserOptions {
    brush_parser::ParserOptions::default()
}

/// Unquoted glob characters make a word's value depend on the filesystem.
fn has_glob(text: &str) -> bool {
    if text.contains(['*', '?', '(']) {
        return true;
    }
    // `[` only starts a bracket expression when a `]` follows (`[` alone is the test command).
    text.find('[')
        .is_some_and(|index| text[index + 1..].contains(']'))
}

fn has_unquoted_brace(pieces: &[WordPieceWithSource]) -> bool {
    pieces
        .iter()
        .any(|piece| matches!(&piece.piece, WordPiece::Text(text) if text.contains('{')))
}

fn is_brace_expansion(text: &str) -> bool {
    match bword::parse_brace_expansions(text, &parser_options()) {
        Ok(Some(parts)) => parts
            .iter()
            .any(|part| matches!(part, bword::BraceExpressionOrText::Expr(_))),
        Ok(None) => false,
        // Unparseable braces: assume they expand.
        Err(_) => true,
    }
}

fn tilde_text(tilde: &bword::TildeExpr) -> String {
    match tilde {
        bword::TildeExpr::Home => "~".to_owned(),
        bword::TildeExpr::UserHome(user) => format!("~{user}"),
        bword::TildeExpr::WorkingDir => "~+".to_owned(),
        bword::TildeExpr::OldWorkingDir => "~-".to_owned(),
        bword::TildeExpr::NthDirFromTopOfDirStack { n, plus_used } => {
            format!("~{}{n}", if *plus_used { "+" } else { "" })
        }
        bword::TildeExpr::NthDirFromBottomOfDirStack { n } => format!("~-{n}"),
    }
}

/// Resolve a backslash escape: unquoted `\c` is `c`; inside double quotes only `$`, `` ` ``,
/// `"`, `\` and newline are escapable; `\<newline>` is a line continuation.
fn unescape(sequence: &str, quoted: bool) -> String {
    let Some(rest) = sequence.strip_prefix('\\') else {
        return sequence.to_owned();
    };
    if rest == "\n" {
        return String::new();
    }
    if !quoted || rest.starts_with(['$', '`', '"', '\\']) {
        rest.to_owned()
    } else {
        sequence.to_owned()
    }
}

/// Inside backquotes a backslash only escapes `$`, `` ` `` and `\`.
fn unescape_backquoted(script: &str) -> String {
    let mut out = String::with_capacity(script.len());
    let mut chars = script.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\'
            && let Some(&next) = chars.peek()
            && matches!(next, '$' | '`' | '\\')
        {
            out.push(next);
            chars.next();
            continue;
        }
        out.push(c);
    }
    out
}

/// Decode the body of a `$'…'` string the way bash does.
fn decode_ansi_c(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let digits = |start: usize, max: usize, radix: u32| -> (u32, usize) {
        let mut value = 0u32;
        let mut count = 0;
        while count < max
            && let Some(digit) = chars.get(start + count).and_then(|c| c.to_digit(radix))
        {
            value = value.wrapping_mul(radix).wrapping_add(digit);
            count += 1;
        }
        (value, count)
    };
    while i < chars.len() {
        let c = chars[i];
        if c != '\\' || i + 1 >= chars.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let next = chars[i + 1];
        i += 2;
        let simple = match next {
            'a' => Some('\u{7}'),
            'b' => Some('\u{8}'),
            'e' | 'E' => Some('\u{1b}'),
            'f' => Some('\u{c}'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\u{b}'),
            '\\' => Some('\\'),
            '\'' => Some('\''),
            '"' => Some('"'),
            '?' => Some('?'),
            _ => None,
        };
        if let Some(simple) = simple {
            out.push(simple);
            continue;
        }
        match next {
            '0'..='7' => {
                let (value, count) = digits(i - 1, 3, 8);
                out.push(char::from_u32(value & 0xff).unwrap_or('\u{fffd}'));
                i = i - 1 + count;
            }
            'x' | 'u' | 'U' => {
                let max = match next {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let (value, count) = digits(i, max, 16);
                if count == 0 {
                    out.push('\\');
                    out.push(next);
                } else {
                    out.push(char::from_u32(value).unwrap_or('\u{fffd}'));
                    i += count;
                }
            }
            'c' => match chars.get(i) {
                Some(&control) => {
                    out.push(char::from_u32(u32::from(control) & 0x1f).unwrap_or('\u{fffd}'));
                    i += 1;
                }
                None => {
                    out.push('\\');
                    out.push('c');
                }
            },
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    out
}

/// Quote a literal for display in reasons when it would otherwise be ambiguous.
pub(crate) fn quote_for_display(text: &str) -> String {
    let special = |c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '\'' | '"' | '\\' | '$' | '`' | ';' | '&' | '|' | ')' | '<' | '>' | '#'
            )
    };
    if !text.is_empty() && !text.chars().any(special) && !has_glob(text) {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(script: &str) -> Vec<String> {
        let analysis = analyse_script(script);
        assert!(
            analysis.is_complete(),
            "unexpected unanalysable parts in {script:?}: {:?}",
            analysis.unanalysable
        );
        analysis.commands.iter().map(ToString::to_string).collect()
    }

    fn opaque(script: &str) -> Vec<String> {
        let analysis = analyse_script(script);
        assert!(
            !analysis.is_complete(),
            "{script:?} should be unanalysable, got {:?}",
            analysis.commands
        );
        analysis.unanalysable
    }

    #[test]
    fn quotes_and_escapes_are_resolved() {
        assert_eq!(commands(r#"g\it push"#), ["git push"]);
        assert_eq!(commands(r#""git" 'push'"#), ["git push"]);
        assert_eq!(commands(r"$'g\x69t' $'\160ush'"), ["git push"]);
        assert_eq!(commands("gi\\\nt push"), ["git push"]);
        assert_eq!(commands(r#"echo "a\b" "\$x""#), [r"echo 'a\b' '$x'"]);
    }

    #[test]
    fn lists_pipelines_and_compound_commands_are_walked() {
        assert_eq!(
            commands("a; b && c || d | e |& f & g"),
            ["a", "b", "c", "d", "e", "f", "g"]
        );
        assert_eq!(commands("(a) && { b; }"), ["a", "b"]);
        assert_eq!(
            commands("if a; then b; elif c; then d; else e; fi"),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(
            commands("while a; do b; done; until c; do d; done"),
            ["a", "b", "c", "d"]
        );
        assert_eq!(commands("for x in 1 2; do a $x; done"), ["a $x"]);
        assert_eq!(commands("for ((i=0;i<3;i++)); do a; done"), ["a"]);
        assert_eq!(commands("case $x in y) a;; *) b;; esac"), ["a", "b"]);
        assert_eq!(commands("f() { a; }; function g { b; }"), ["a", "b"]);
        assert_eq!(commands("! a"), ["a"]);
        assert_eq!(commands("time a"), ["a"]);
        assert_eq!(commands("[[ -f $(a) ]]"), ["a"]);
        assert_eq!(commands("(( $(a) + 1 ))"), ["a"]);
        assert_eq!(commands("(( i++ )); ((x > 1))"), Vec::<String>::new());
        assert_eq!(commands("( (a b) )"), ["a b"]);
        assert_eq!(commands("((a b) )"), ["a b"]);
        assert_eq!(commands("((a)&&(b))"), ["a", "b"]);
        assert_eq!(commands("é; ( (a) )"), ["é", "a"]);
        assert!(dparen_is_arithmetic("((1 + (2)))"));
        assert!(dparen_is_arithmetic("(( x ')' ))"));
        assert!(!dparen_is_arithmetic("((a) + (b))"));
    }

    #[test]
    fn substitutions_are_found_everywhere() {
        assert_eq!(commands("echo $(a)"), ["a", "echo $(a)"]);
        assert_eq!(commands("echo `a`"), ["a", "echo `a`"]);
        assert_eq!(commands("diff <(a) >(b)"), ["a", "b", "diff <(…) <(…)"]);
        assert_eq!(commands("x=$(a)"), ["a"]);
        assert_eq!(commands("echo ${x:-$(a)}"), ["a", "echo ${x:-$(a)}"]);
        assert_eq!(commands("echo $((1 + $(a)))"), ["a", "echo $((1 + $(a)))"]);
        assert_eq!(commands("cat > $(a)"), ["a", "cat"]);
        assert_eq!(commands("cat <<EOF\n$(a)\nEOF\n"), ["a", "cat"]);
        assert_eq!(commands("cat <<'EOF'\n$(a)\nEOF\n"), ["cat"]);
        assert_eq!(commands("cat <<< \"$(a)\""), ["a", "cat"]);
        assert_eq!(
            commands("echo `echo \\`a\\``"),
            ["a", "echo `a`", "echo `echo \\`a\\``"]
        );
    }

    #[test]
    fn dynamic_words_are_marked() {
        let analysis = analyse_script("rm -rf *.o $x 'lit*' {a,b} \"$y\"");
        assert_eq!(
            analysis.commands[0].args,
            vec![
                Word::Literal("-rf".into()),
                Word::Dynamic("*.o".into()),
                Word::Dynamic("$x".into()),
                Word::Literal("lit*".into()),
                Word::Dynamic("{a,b}".into()),
                Word::Dynamic("\"$y\"".into()),
            ]
        );
        assert_eq!(commands("[ -f x ]"), ["[ -f x ]"]);
    }

    #[test]
    fn paths_are_reduced_to_the_program_name() {
        let analysis = analyse_script("/usr/bin/git push");
        assert_eq!(analysis.commands[0].program, "git");
        assert_eq!(
            analysis.commands[0].program_path.as_deref(),
            Some("/usr/bin/git")
        );
        assert_eq!(analyse_script("~/bin/git").commands[0].program, "git");
    }

    #[test]
    fn dynamic_command_names_are_unanalysable() {
        assert!(opaque("a=git; $a push")[0].contains("`$a`"));
        assert!(opaque("$(echo git) push")[0].contains("computed at run time"));
        assert!(opaque("`which git` push")[0].contains("computed at run time"));
        assert!(opaque("g{i,}t push")[0].contains("computed at run time"));
        assert!(opaque("/usr/bin/gi? push")[0].contains("computed at run time"));
    }

    #[test]
    fn sensitive_assignments_are_unanalysable() {
        assert!(opaque("PATH=. git status")[0].contains("PATH"));
        assert!(opaque("export PATH=/tmp:$PATH; git status")[0].contains("PATH"));
        assert!(opaque("LD_PRELOAD=./x.so ls")[0].contains("LD_PRELOAD"));
        assert!(opaque("PS4='$(a)'; set -x")[0].contains("PS4"));
        assert!(opaque("printf -v PATH /tmp; git status")[0].contains("PATH"));
        assert!(opaque("read -r PATH <<< /tmp")[0].contains("PATH"));
        assert!(opaque("PATH+=:/tmp/x")[0].contains("PATH"));
        assert_eq!(commands("FOO=1 make"), ["make"]);
        assert_eq!(commands("let x=$(a)"), ["a", "let x=$(a)"]);
    }

    #[test]
    fn syntax_errors_and_depth_are_unanalysable() {
        assert!(opaque("echo 'unterminated")[0].contains("failed to parse"));
        assert!(opaque("if true; then")[0].contains("failed to parse"));
        let mut deep = "git push".to_owned();
        for _ in 0..=MAX_DEPTH + 1 {
            deep = format!("bash -c {}", quote_for_display(&deep));
        }
        assert!(opaque(&deep)[0].contains("nested"));
    }

    #[test]
    fn deep_nesting_is_refused_before_it_can_overflow_the_stack() {
        let kinds: [(&str, &str, &str); 8] = [
            ("{ ", "true; ", "} "),
            ("if true; then ", "true", "; fi"),
            ("case x in x) ", "true", ";; esac "),
            ("while true; do ", "true", "; done"),
            ("f() { ", "true", "; }"),
            ("$(", "true", ")"),
            ("echo ${a:-", "x", "}"),
            ("( ", "true", " ) "),
        ];
        for (open, middle, close) in kinds {
            for levels in [MAX_OPENERS / 2, 20_000] {
                let script = format!("{}{middle}{}", open.repeat(levels), close.repeat(levels));
                // On tokio's default worker stack: the parser must not overflow it.
                let analysis = std::thread::Builder::new()
                    .stack_size(2 << 20)
                    .spawn(move || analyse_script(&script))
                    .unwrap()
                    .join()
                    .unwrap();
                if levels > MAX_OPENERS {
                    let reasons = analysis.unanalysable.join("; ");
                    assert!(
                        reasons.contains("brackets and compound commands"),
                        "{reasons}"
                    );
                }
            }
        }
        assert_eq!(opener_count("if (a) { b; } fi [x]"), 4);
        assert_eq!(opener_count("echo '((((((('"), 0);
        assert_eq!(opener_count("for x in a; do case y in z) ;; esac; done"), 2);
    }

    #[test]
    fn pathological_scripts_run_out_of_budget_instead_of_time() {
        let cases = [
            "(".repeat(26),
            "(".repeat(30),
            format!("echo {}", "{".repeat(18)),
            format!("echo {}", "{a,".repeat(16)),
            format!("echo {}x{}", "{".repeat(20), "}".repeat(20)),
            format!("cat <<EOF\n{}\nEOF\n", "$(echo ".repeat(17)),
        ];
        for script in &cases {
            let analysis = analyse_script(script);
            assert!(analysis.steps <= step_budget(script.len()), "{script}");
            assert_eq!(
                analysis.unanalysable,
                [format!(
                    "the script is too complex to analyse (it needs more than {} parser steps); split it into simpler commands",
                    step_budget(script.len())
                )],
                "{script}"
            );
        }
        let wrappers = "env ".repeat(8_000) + "git push";
        let analysis = analyse_script(&wrappers);
        assert!(
            analysis.unanalysable[0].contains("more than 64 programs run one another"),
            "{:?}",
            analysis.unanalysable
        );
        // A command found before the budget ran out is still judged by the rules.
        let analysis = analyse_script(&format!("git push; echo {}", "{a,".repeat(16)));
        assert_eq!(analysis.commands[0].to_string(), "git push");
        assert!(analysis.unanalysable[0].contains("too complex"));
    }

    #[test]
    fn the_budget_scales_with_the_script_and_is_capped() {
        assert_eq!(step_budget(0), BASE_STEPS);
        assert_eq!(step_budget(1000), BASE_STEPS + 1000 * STEPS_PER_BYTE);
        assert_eq!(step_budget(MAX_SCRIPT_BYTES), MAX_STEPS);
        // Everyday scripts stay far below it.
        let script = "set -euo pipefail\nfor f in src/*.rs; do\n  if grep -q TODO \"$f\"; then echo \"$f\"; fi\ndone\ncargo test --workspace 2>&1 | tail -n 20\n";
        let analysis = analyse_script(script);
        assert!(analysis.is_complete(), "{:?}", analysis.unanalysable);
        assert!(
            analysis.steps < step_budget(script.len()) / 10,
            "{}",
            analysis.steps
        );
        // The same script with a budget too small for it.
        let analysis = analyse_script_within(script, 50);
        assert!(analysis.unanalysable[0].contains("more than 50 parser steps"));
    }

    #[test]
    fn evaluated_subscripts_are_unanalysable() {
        for script in [
            "test -v 'a[$(git push)]'",
            "[ -v 'a[`git push`]' ]",
            "[[ -v 'a[${x:-$(git push)}]' ]]",
            "printf -v 'a[$(git push)]' x",
            "unset 'a[$(git push)]'",
            "x='a[$(git push)]'",
        ] {
            assert!(opaque(script).join("; ").contains("subscript"), "{script}");
        }
        assert_eq!(commands("test -v 'a[1]'"), ["test -v 'a[1]'"]);
        assert_eq!(commands("echo 'a[$(x)]'"), ["echo 'a[$(x)]'"]);
        for script in [
            "a=(1); echo ${a['$(git push)']}",
            "echo ${s:'a[$(git push)]'}",
            "echo ${s:0:\"a[\\`git push\\`]\"}",
        ] {
            assert!(opaque(script).join("; ").contains("arithmetic"), "{script}");
        }
        assert_eq!(commands("echo ${a[1]} ${s:1:2}"), ["echo ${a[1]} ${s:1:2}"]);
        assert!(super::evaluates_subscript("a[$(x)]"));
        assert!(!super::evaluates_subscript("$(x)[1]"));
    }

    #[test]
    fn ansi_c_decoding() {
        assert_eq!(
            decode_ansi_c(r"a\tb\x41\u00e9\101\cA\q\\"),
            "a\tbAéA\u{1}\\q\\"
        );
        assert_eq!(decode_ansi_c(r"\xZ"), r"\xZ");
    }
}
