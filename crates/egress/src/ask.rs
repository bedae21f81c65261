//! Destinations an ask entry (`[network] ask`) matches: the approver hook the proxy calls, the
//! session's approved destinations, and the rule that one call has at most one question in
//! flight per destination (its connections to it meanwhile wait for that answer; another
//! call's are asked about on their own, an answer "once" covering only the call it was given
//! to). It does not show questions (a
//! front end's [`EgressApprover`] does) nor decide which entry matched ([`crate::rules`]).
//!
//! An approval "for the session" adds the exact destination asked about (`host:port`, never the
//! wildcard entry that matched) to the proxy's approved set; later connections to it are not
//! asked again. An approved destination is still resolved and its addresses checked like any
//! allowed one: an approval never lets a name reach a loopback, private or metadata address.
//!
//! A command must not be able to bury the person in questions: one question is put at a time
//! (connections to other destinations wait their turn, within the same bound), and within one
//! call a destination the person refused (or let time out) is not asked about again, nor is
//! anything once [`MAX_REFUSALS_PER_CALL`] destinations were refused: those connections are
//! [`Asked::Withheld`]. Connections no backend ties to a call share one such record for the
//! session.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OnceCell, Semaphore};

use crate::rules::{Host, Matched};

/// Most destinations approved for one session; approvals beyond it count for one connection.
pub const MAX_SESSION_APPROVALS: usize = 1024;
/// Questions put to the person at once; questions about other destinations wait their turn.
pub const MAX_QUESTIONS_AT_ONCE: usize = 1;
/// Destinations the person may refuse (or leave unanswered) for one call; after that the
/// call's connections to ask destinations are refused without asking.
pub const MAX_REFUSALS_PER_CALL: usize = 3;
/// How much longer than an approver's own bound ([`EgressApprover::answer_within`]) the proxy
/// waits for its answer.
pub const APPROVER_MARGIN: Duration = Duration::from_secs(5);
/// Calls whose refusals are remembered; the oldest is forgotten first.
const MAX_CALLS_REMEMBERED: usize = 256;

/// A question about one destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AskRequest {
    /// The proxy's session label.
    pub session: Arc<str>,
    /// The tool call whose command opened the connection, when the backend knows it (it
    /// served the connection on a listener of that one command): a front end routes the
    /// question to whoever made that call. The backend assigns it; nothing the command sends
    /// can choose it.
    pub call: Option<Arc<str>>,
    /// The requested host (normalised: lowercase ASCII name characters, or an address).
    pub host: Host,
    /// The requested port.
    pub port: u16,
    /// The ask entry that matched and its `FILE:LINE`.
    pub entry: Matched,
}

/// An approver's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskAnswer {
    /// Allow this connection (and the same call's connections that waited for this answer).
    Once,
    /// Allow this destination for the rest of the session.
    Session,
    /// Refuse it.
    Deny,
    /// The person was asked but no usable answer came (none within the approver's own bound,
    /// the question dismissed, a reply that could not be read): a refusal, recorded as
    /// [`Asked::TimedOut`].
    NoAnswer,
    /// Nobody can be asked about it (the front end has no way to reach a person for it).
    Unavailable,
}

/// Something that can ask a person whether a destination may be reached.
#[async_trait::async_trait]
pub trait EgressApprover: Send + Sync {
    /// Asks; a failure to ask is [`AskAnswer::Deny`]. The proxy bounds the wait.
    async fn ask(&self, request: AskRequest) -> AskAnswer;

    /// How long this approver waits for a person before it gives up by itself (an operator's
    /// setting), when it bounds the wait; the proxy then waits that long plus
    /// [`APPROVER_MARGIN`] instead of its own [`crate::proxy::Limits::ask_timeout`], so the
    /// approver's bound is the one that applies (and it withdraws its question).
    fn answer_within(&self) -> Option<Duration> {
        None
    }
}

/// How an ask entry's destination was settled, as the connection's event records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// Approved for this connection.
    Once,
    /// Approved for the rest of the session.
    Session,
    /// An approval for the session given earlier covered it; nobody was asked.
    Remembered,
    /// The person asked did not approve it (said no, dismissed the question).
    Refused,
    /// No usable answer came in time (none at all, or the question dismissed).
    TimedOut,
    /// Nobody can be asked here (no approver).
    NoApprover,
    /// Not asked again: the person refused this destination, or
    /// [`MAX_REFUSALS_PER_CALL`] destinations, earlier in the same call.
    Withheld,
}

impl Asked {
    /// Whether the connection may go on (to the address check).
    pub fn approved(self) -> bool {
        match self {
            Asked::Once | Asked::Session | Asked::Remembered => true,
            Asked::Refused | Asked::TimedOut | Asked::NoApprover | Asked::Withheld => false,
        }
    }
}

/// What became of a question.
#[derive(Clone, Copy, Debug)]
enum Settled {
    /// The approver's answer.
    Answered(AskAnswer),
    /// None came in time (waiting for the turn included).
    TimedOut,
    /// When its turn came, the asking call had refused too much to be asked again.
    Withheld,
    /// When its turn came, another call's question had approved the destination for the
    /// session.
    Remembered,
}

/// A question in flight, shared by the connections waiting for its answer.
type Pending = Arc<OnceCell<Settled>>;

/// What a question in flight is about: the call that asks (its person answers for its
/// connections only) and the destination.
type PendingKey = (Option<Arc<str>>, String);

/// The destinations each call's person refused (or left unanswered), by call (`None`: the
/// connections no backend tied to a call), oldest call first.
#[derive(Default)]
struct Refusals {
    by_call: HashMap<Option<Arc<str>>, HashSet<String>>,
    order: VecDeque<Option<Arc<str>>>,
}

impl Refusals {
    /// Whether `call` is not to be asked about `destination` any more.
    fn withheld(&self, call: &Option<Arc<str>>, destination: &str) -> bool {
        self.by_call.get(call).is_some_and(|refused| {
            refused.len() >= MAX_REFUSALS_PER_CALL || refused.contains(destination)
        })
    }

    fn record(&mut self, call: &Option<Arc<str>>, destination: &str) {
        if !self.by_call.contains_key(call) {
            if self.order.len() >= MAX_CALLS_REMEMBERED
                && let Some(oldest) = self.order.pop_front()
            {
                self.by_call.remove(&oldest);
            }
            self.order.push_back(call.clone());
        }
        let refused = self.by_call.entry(call.clone()).or_default();
        if refused.len() < MAX_REFUSALS_PER_CALL {
            refused.insert(destination.to_owned());
        }
    }
}

/// One proxy's approvals: the approver, how long to wait for it, the destinations approved for
/// the session, the questions in flight, whose turn it is to ask and what each call refused.
pub(crate) struct Approvals {
    approver: Option<Arc<dyn EgressApprover>>,
    timeout: Duration,
    approved: Mutex<HashSet<String>>,
    pending: Mutex<HashMap<PendingKey, Pending>>,
    turn: Semaphore,
    refusals: Mutex<Refusals>,
}

impl Approvals {
    /// Approvals asking `approver`, waiting `timeout` for it unless it has its own bound.
    pub(crate) fn new(approver: Option<Arc<dyn EgressApprover>>, timeout: Duration) -> Self {
        let timeout = approver
            .as_ref()
            .and_then(|approver| approver.answer_within())
            .map_or(timeout, |own| own.saturating_add(APPROVER_MARGIN));
        Approvals {
            approver,
            timeout,
            approved: Mutex::new(HashSet::new()),
            pending: Mutex::new(HashMap::new()),
            turn: Semaphore::new(MAX_QUESTIONS_AT_ONCE),
            refusals: Mutex::new(Refusals::default()),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Settles a destination an ask entry matched: the session's approvals, else the call's
    /// refusals, else the question already in flight for it, else a new question (put when
    /// it is its turn) bounded by the timeout.
    pub(crate) async fn settle(&self, request: AskRequest) -> Asked {
        let key = format!("{}:{}", request.host, request.port);
        if lock(&self.approved).contains(&key) {
            tracing::debug!(destination = %key, "egress proxy: destination approved earlier in the session");
            return Asked::Remembered;
        }
        let Some(approver) = self.approver.clone() else {
            return Asked::NoApprover;
        };
        let call = request.call.clone();
        if lock(&self.refusals).withheld(&call, &key) {
            tracing::info!(
                destination = %key,
                call = call.as_deref(),
                limit = MAX_REFUSALS_PER_CALL,
                "egress proxy: not asking again, refused earlier in this call"
            );
            return Asked::Withheld;
        }
        // One question per call and destination: an answer given to one call's person does
        // not let another call's connections through (only a session approval does).
        let pending_key = (call.clone(), key);
        let cell = lock(&self.pending)
            .entry(pending_key.clone())
            .or_default()
            .clone();
        let guard = PendingGuard {
            pending: &self.pending,
            key: pending_key,
            cell,
        };
        let timeout = self.timeout;
        let settled = *guard
            .cell
            .get_or_init(|| async move {
                let asking = async {
                    // The semaphore is never closed; an error would only mean no turn.
                    let Ok(_turn) = self.turn.acquire().await else {
                        return Settled::Withheld;
                    };
                    // Questions answered while this one waited may have used up the call's.
                    let destination = format!("{}:{}", request.host, request.port);
                    if lock(&self.approved).contains(&destination) {
                        return Settled::Remembered;
                    }
                    if lock(&self.refusals).withheld(&request.call, &destination) {
                        return Settled::Withheld;
                    }
                    tracing::info!(
                        session = %request.session,
                        call = request.call.as_deref(),
                        host = %request.host,
                        port = request.port,
                        entry = %request.entry,
                        "egress proxy: asking whether a destination may be reached"
                    );
                    let call = request.call.clone();
                    let answer = approver.ask(request).await;
                    if matches!(answer, AskAnswer::Deny | AskAnswer::NoAnswer) {
                        // Before the next question gets the turn, which may be this call's.
                        lock(&self.refusals).record(&call, &destination);
                    }
                    Settled::Answered(answer)
                };
                tokio::time::timeout(timeout, asking)
                    .await
                    .unwrap_or(Settled::TimedOut)
            })
            .await;
        let key = &guard.key.1;
        let asked = match settled {
            Settled::Answered(AskAnswer::Session) => {
                let mut approved = lock(&self.approved);
                if approved.len() < MAX_SESSION_APPROVALS {
                    approved.insert(key.clone());
                    Asked::Session
                } else {
                    tracing::warn!(
                        destination = %key,
                        limit = MAX_SESSION_APPROVALS,
                        "egress proxy: too many destinations approved for the session; this approval counts once"
                    );
                    Asked::Once
                }
            }
            Settled::Answered(AskAnswer::Once) => Asked::Once,
            Settled::Answered(AskAnswer::Deny) => Asked::Refused,
            Settled::Answered(AskAnswer::NoAnswer) => Asked::TimedOut,
            Settled::Answered(AskAnswer::Unavailable) => Asked::NoApprover,
            Settled::TimedOut => Asked::TimedOut,
            Settled::Withheld => Asked::Withheld,
            Settled::Remembered => Asked::Remembered,
        };
        if matches!(asked, Asked::Refused | Asked::TimedOut) {
            lock(&self.refusals).record(&call, key);
        }
        tracing::info!(destination = %key, call = call.as_deref(), ?asked, "egress proxy: ask settled");
        // Dropping the guard now, after the approved set was updated, means a connection
        // arriving meanwhile finds either the answered question or the approval.
        drop(guard);
        asked
    }
}

/// Removes a question from the in-flight map once it is answered, or when its last waiter is
/// gone unanswered (a connection cut while asking), so cut questions do not pile up.
struct PendingGuard<'a> {
    pending: &'a Mutex<HashMap<PendingKey, Pending>>,
    key: PendingKey,
    cell: Pending,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        let mut pending = lock(self.pending);
        // The map and this guard hold one reference each when nobody else waits.
        let last = Arc::strong_count(&self.cell) <= 2;
        if pending
            .get(&self.key)
            .is_some_and(|p| Arc::ptr_eq(p, &self.cell))
            && (self.cell.initialized() || last)
        {
            pending.remove(&self.key);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded sets stay consistent across a panic (single inserts and removes).
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    /// Answers `answer` once per permit released, counting the questions.
    struct Scripted {
        answer: AskAnswer,
        release: Semaphore,
        asked: AtomicUsize,
    }

    impl Scripted {
        fn new(answer: AskAnswer, released: usize) -> Arc<Scripted> {
            Arc::new(Scripted {
                answer,
                release: Semaphore::new(released),
                asked: AtomicUsize::new(0),
            })
        }

        fn asked(&self) -> usize {
            self.asked.load(Ordering::SeqCst)
        }
    }

    #[async_trait::async_trait]
    impl EgressApprover for Scripted {
        async fn ask(&self, _request: AskRequest) -> AskAnswer {
            self.asked.fetch_add(1, Ordering::SeqCst);
            match self.release.acquire().await {
                Ok(permit) => permit.forget(),
                Err(_) => return AskAnswer::Deny,
            }
            self.answer
        }
    }

    fn request(host: &str, port: u16) -> AskRequest {
        AskRequest {
            session: "s".into(),
            call: None,
            host: Host::parse(host).expect("host"),
            port,
            entry: Matched {
                entry: "*.example.com".into(),
                source: "policy.toml:7".into(),
            },
        }
    }

    fn approvals(approver: &Arc<Scripted>, timeout: Duration) -> Approvals {
        let approver: Arc<dyn EgressApprover> = approver.clone();
        Approvals::new(Some(approver), timeout)
    }

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn concurrent_connections_to_one_destination_share_one_question() {
        let approver = Scripted::new(AskAnswer::Once, 0);
        let approvals = approvals(&approver, LONG);
        // On a current-thread runtime `join!` first polls in order: the first connection is
        // asking, the second is waiting for that question, then the answer is released.
        let (first, second, ()) = tokio::join!(
            approvals.settle(request("a.example.com", 443)),
            approvals.settle(request("a.example.com", 443)),
            async { approver.release.add_permits(1) },
        );
        assert_eq!(
            (first, second, approver.asked()),
            (Asked::Once, Asked::Once, 1)
        );
        // "Once" is not remembered: the next connection asks again.
        approver.release.add_permits(1);
        assert_eq!(
            approvals.settle(request("a.example.com", 443)).await,
            Asked::Once
        );
        assert_eq!(approver.asked(), 2);
        assert!(lock(&approvals.pending).is_empty());
    }

    #[tokio::test]
    async fn an_answer_once_covers_only_the_call_it_was_given_to() {
        let approver = Scripted::new(AskAnswer::Once, 0);
        let approvals = approvals(&approver, LONG);
        // Both calls' connections are waiting when the first answer comes: the second call
        // is asked on its own, after the first.
        let (first, second, asked_meanwhile) = tokio::join!(
            approvals.settle(request_for("call-1", "a.example.com", 443)),
            approvals.settle(request_for("call-2", "a.example.com", 443)),
            async {
                let asked = approver.asked();
                approver.release.add_permits(2);
                asked
            },
        );
        assert_eq!(
            (first, second, asked_meanwhile, approver.asked()),
            (Asked::Once, Asked::Once, 1, 2)
        );
        assert!(lock(&approvals.pending).is_empty());
    }

    #[tokio::test]
    async fn a_question_waiting_its_turn_finds_a_session_approval_given_meanwhile() {
        let approver = Scripted::new(AskAnswer::Session, 0);
        let approvals = approvals(&approver, LONG);
        let (first, second, ()) = tokio::join!(
            approvals.settle(request_for("call-1", "a.example.com", 443)),
            approvals.settle(request_for("call-2", "a.example.com", 443)),
            async { approver.release.add_permits(1) },
        );
        assert_eq!(
            (first, second, approver.asked()),
            (Asked::Session, Asked::Remembered, 1)
        );
    }

    #[tokio::test]
    async fn a_session_approval_covers_that_exact_destination_only() {
        let approver = Scripted::new(AskAnswer::Session, 1);
        let approvals = approvals(&approver, LONG);
        assert_eq!(
            approvals.settle(request("a.example.com", 443)).await,
            Asked::Session
        );
        assert_eq!(
            approvals.settle(request("A.Example.com.", 443)).await,
            Asked::Remembered
        );
        assert_eq!(approver.asked(), 1);
        // Another port or another name the same entry matches is asked about again.
        approver.release.add_permits(2);
        assert_eq!(
            approvals.settle(request("a.example.com", 8443)).await,
            Asked::Session
        );
        assert_eq!(
            approvals.settle(request("b.example.com", 443)).await,
            Asked::Session
        );
        assert_eq!(approver.asked(), 3);
    }

    fn request_for(call: &str, host: &str, port: u16) -> AskRequest {
        AskRequest {
            call: Some(call.into()),
            ..request(host, port)
        }
    }

    #[tokio::test]
    async fn a_refusal_is_remembered_for_its_call_only() {
        let approver = Scripted::new(AskAnswer::Deny, 2);
        let approvals = approvals(&approver, LONG);
        assert_eq!(
            approvals
                .settle(request_for("call-1", "a.example.com", 443))
                .await,
            Asked::Refused
        );
        // The same call does not ask about it again.
        assert_eq!(
            approvals
                .settle(request_for("call-1", "a.example.com", 443))
                .await,
            Asked::Withheld
        );
        assert_eq!(approver.asked(), 1);
        // Another call does.
        assert_eq!(
            approvals
                .settle(request_for("call-2", "a.example.com", 443))
                .await,
            Asked::Refused
        );
        assert_eq!(approver.asked(), 2);
    }

    #[tokio::test]
    async fn a_call_that_had_too_many_refusals_is_asked_nothing_more() {
        let approver = Scripted::new(AskAnswer::Deny, MAX_REFUSALS_PER_CALL + 1);
        let approvals = approvals(&approver, LONG);
        for n in 0..MAX_REFUSALS_PER_CALL {
            let host = format!("h{n}.example.com");
            assert_eq!(
                approvals.settle(request_for("call-1", &host, 443)).await,
                Asked::Refused
            );
        }
        assert_eq!(
            approvals
                .settle(request_for("call-1", "new.example.com", 443))
                .await,
            Asked::Withheld
        );
        assert_eq!(approver.asked(), MAX_REFUSALS_PER_CALL);
        // Another call is asked.
        assert_eq!(
            approvals
                .settle(request_for("call-2", "new.example.com", 443))
                .await,
            Asked::Refused
        );
    }

    #[tokio::test]
    async fn an_unanswered_question_counts_as_a_refusal_for_its_call() {
        // Never released, zero timeout: every question goes unanswered.
        let approver = Scripted::new(AskAnswer::Session, 0);
        let approvals = approvals(&approver, Duration::ZERO);
        assert_eq!(
            approvals
                .settle(request_for("call-1", "a.example.com", 443))
                .await,
            Asked::TimedOut
        );
        assert_eq!(
            approvals
                .settle(request_for("call-1", "a.example.com", 443))
                .await,
            Asked::Withheld
        );
    }

    #[tokio::test]
    async fn questions_about_different_destinations_are_put_one_at_a_time() {
        let approver = Scripted::new(AskAnswer::Once, 0);
        let approvals = approvals(&approver, LONG);
        // On a current-thread runtime `join!` first polls in order: the first connection is
        // asking, the second waits for its turn; the third branch sees how many were asked
        // before it releases both answers.
        let (first, second, asked_meanwhile) = tokio::join!(
            approvals.settle(request_for("call-1", "a.example.com", 443)),
            approvals.settle(request_for("call-1", "b.example.com", 443)),
            async {
                let asked = approver.asked();
                approver.release.add_permits(2);
                asked
            },
        );
        assert_eq!(
            (first, second, asked_meanwhile, approver.asked()),
            (Asked::Once, Asked::Once, 1, 2)
        );
    }

    #[tokio::test]
    async fn a_question_waiting_its_turn_is_withheld_once_its_call_refused_too_much() {
        let approver = Scripted::new(AskAnswer::Deny, 0);
        let approvals = approvals(&approver, LONG);
        for n in 0..MAX_REFUSALS_PER_CALL - 1 {
            approver.release.add_permits(1);
            let host = format!("h{n}.example.com");
            assert_eq!(
                approvals.settle(request_for("call-1", &host, 443)).await,
                Asked::Refused
            );
        }
        // The last refusal the call may have is being asked; another destination waits.
        let (last, waiting, ()) = tokio::join!(
            approvals.settle(request_for("call-1", "last.example.com", 443)),
            approvals.settle(request_for("call-1", "waiting.example.com", 443)),
            async { approver.release.add_permits(2) },
        );
        assert_eq!((last, waiting), (Asked::Refused, Asked::Withheld));
        assert_eq!(approver.asked(), MAX_REFUSALS_PER_CALL);
    }

    #[test]
    fn the_calls_whose_refusals_are_remembered_are_bounded() {
        let mut refusals = Refusals::default();
        for n in 0..=MAX_CALLS_REMEMBERED {
            refusals.record(&Some(format!("call-{n}").into()), "a.example.com:443");
        }
        assert_eq!(refusals.by_call.len(), MAX_CALLS_REMEMBERED);
        assert_eq!(refusals.order.len(), MAX_CALLS_REMEMBERED);
        // The oldest was forgotten, the newest is there.
        assert!(!refusals.withheld(&Some("call-0".into()), "a.example.com:443"));
        let newest = Some(format!("call-{MAX_CALLS_REMEMBERED}").into());
        assert!(refusals.withheld(&newest, "a.example.com:443"));
    }

    #[tokio::test]
    async fn no_answer_in_time_is_a_refusal() {
        // Never released: the approver never answers; a zero timeout elapses at once.
        let approver = Scripted::new(AskAnswer::Session, 0);
        let approvals = approvals(&approver, Duration::ZERO);
        assert_eq!(
            approvals.settle(request("a.example.com", 443)).await,
            Asked::TimedOut
        );
        assert!(lock(&approvals.approved).is_empty());
        assert!(lock(&approvals.pending).is_empty());
    }

    #[tokio::test]
    async fn no_usable_answer_from_the_approver_is_recorded_as_no_answer_in_time() {
        let approver = Scripted::new(AskAnswer::NoAnswer, 1);
        let approvals = approvals(&approver, LONG);
        assert_eq!(
            approvals
                .settle(request_for("call-1", "a.example.com", 443))
                .await,
            Asked::TimedOut
        );
        // Like a refusal, it is not asked about again in that call.
        assert_eq!(
            approvals
                .settle(request_for("call-1", "a.example.com", 443))
                .await,
            Asked::Withheld
        );
    }

    #[tokio::test]
    async fn an_approver_that_cannot_reach_anyone_is_no_approver() {
        let approver = Scripted::new(AskAnswer::Unavailable, 1);
        let approvals = approvals(&approver, LONG);
        assert_eq!(
            approvals.settle(request("a.example.com", 443)).await,
            Asked::NoApprover
        );
    }

    #[tokio::test]
    async fn without_an_approver_nobody_is_asked() {
        let approvals = Approvals::new(None, LONG);
        assert_eq!(
            approvals.settle(request("a.example.com", 443)).await,
            Asked::NoApprover
        );
    }

    /// Answers `Once` when released, and says it waits `own` for a person.
    struct OwnBound {
        inner: Arc<Scripted>,
        own: Duration,
    }

    #[async_trait::async_trait]
    impl EgressApprover for OwnBound {
        async fn ask(&self, request: AskRequest) -> AskAnswer {
            self.inner.ask(request).await
        }

        fn answer_within(&self) -> Option<Duration> {
            Some(self.own)
        }
    }

    #[tokio::test]
    async fn an_approver_with_its_own_bound_is_waited_for_that_long() {
        let inner = Scripted::new(AskAnswer::Once, 0);
        let approver: Arc<dyn EgressApprover> = Arc::new(OwnBound {
            inner: inner.clone(),
            own: LONG,
        });
        // The proxy's own bound would give up at once; the approver's applies instead.
        let approvals = Approvals::new(Some(approver), Duration::ZERO);
        assert_eq!(approvals.timeout(), LONG + APPROVER_MARGIN);
        let (asked, ()) = tokio::join!(approvals.settle(request("a.example.com", 443)), async {
            inner.release.add_permits(1)
        },);
        assert_eq!(asked, Asked::Once);
    }

    #[tokio::test]
    async fn a_question_cut_before_its_answer_leaves_nothing_behind() {
        let approver = Scripted::new(AskAnswer::Session, 0);
        let approvals = approvals(&approver, LONG);
        {
            let settling = std::pin::pin!(approvals.settle(request("a.example.com", 443)));
            // One poll: the question is in flight; then the connection is cut.
            assert!(futures_poll_once(settling).await.is_none());
            assert_eq!(lock(&approvals.pending).len(), 1);
        }
        assert!(lock(&approvals.pending).is_empty());
        assert_eq!(approver.asked(), 1);
    }

    async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
                std::task::Poll::Ready(output) => Some(output),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }

    #[tokio::test]
    async fn session_approvals_are_bounded() {
        let approver = Scripted::new(AskAnswer::Session, MAX_SESSION_APPROVALS + 1);
        let approvals = approvals(&approver, LONG);
        for port in 1..=MAX_SESSION_APPROVALS {
            let port = u16::try_from(port).expect("port");
            assert_eq!(
                approvals.settle(request("a.example.com", port)).await,
                Asked::Session
            );
        }
        assert_eq!(
            approvals.settle(request("a.example.com", 9999)).await,
            Asked::Once
        );
        assert_eq!(lock(&approvals.approved).len(), MAX_SESSION_APPROVALS);
    }
}
