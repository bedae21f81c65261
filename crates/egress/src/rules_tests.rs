use super::*;

fn spec(text: &str, line: usize) -> EntrySpec {
    EntrySpec::new(text, format!("policy.toml:{line}"))
}

fn rules(allow: &[&str], deny: &[&str]) -> Rules {
    let allow: Vec<_> = allow
        .iter()
        .enumerate()
        .map(|(i, t)| spec(t, i + 1))
        .collect();
    let deny: Vec<_> = deny
        .iter()
        .enumerate()
        .map(|(i, t)| spec(t, i + 101))
        .collect();
    Rules::compile(&allow, &deny).expect("test rules compile")
}

fn name(text: &str) -> Host {
    Host::parse(text).expect("test host parses")
}

fn matched(entry: &str, source: &str) -> Matched {
    Matched {
        entry: entry.into(),
        source: source.into(),
    }
}

fn problem(text: &str) -> EntryProblem {
    Entry::parse(text, "t:1".into()).expect_err("entry must be rejected")
}

fn net(text: &str) -> IpNet {
    match Entry::parse(text, "t:1".into())
        .expect("entry parses")
        .target
    {
        Target::Net(net) => net,
        other => panic!("not a network: {other:?}"),
    }
}

#[test]
fn entry_syntax_parses_into_targets_and_ports() {
    let parsed = |text: &str| {
        let entry = Entry::parse(text, "t:1".into()).expect("entry parses");
        (entry.target, entry.ports)
    };
    assert_eq!(
        parsed("crates.io"),
        (Target::Name("crates.io".into()), Ports::Web)
    );
    assert_eq!(
        parsed("pypi.org:443"),
        (Target::Name("pypi.org".into()), Ports::One(443))
    );
    assert_eq!(
        parsed("*.crates.io"),
        (Target::Subdomains("crates.io".into()), Ports::Web)
    );
    assert_eq!(
        parsed("*.example.com:8443"),
        (Target::Subdomains("example.com".into()), Ports::One(8443))
    );
    assert_eq!(parsed("10.1.2.0/24:5432").1, Ports::One(5432));
    assert_eq!(net("10.1.2.0/24:5432").to_string(), "10.1.2.0/24");
    assert_eq!(
        parsed("10.1.2.3"),
        (Target::Net(net("10.1.2.3/32")), Ports::Any)
    );
    assert_eq!(parsed("[fd00::/8]:443").1, Ports::One(443));
    assert_eq!(net("[fd00::/8]:443").to_string(), "fd00::/8");
    assert_eq!(
        parsed("fd00::/8"),
        (Target::Net(net("[fd00::/8]")), Ports::Any)
    );
    assert_eq!(parsed("fd00::1").1, Ports::Any);
    assert_eq!(parsed("[::1]").1, Ports::Any);
    assert_eq!(
        parsed("xn--bcher-kva.example").0,
        Target::Name("xn--bcher-kva.example".into())
    );
    // an IPv4-mapped network is compared as IPv4
    assert_eq!(net("[::ffff:10.0.0.0/104]").to_string(), "10.0.0.0/8");
}

#[test]
fn invalid_entries_are_refused_with_the_reason() {
    assert_eq!(problem(""), EntryProblem::Empty);
    assert_eq!(
        problem(&"a".repeat(301)),
        EntryProblem::TooLong { len: 301, max: 300 }
    );
    assert_eq!(problem("a.com:0"), EntryProblem::BadPort("0".into()));
    assert_eq!(
        problem("a.com:65536"),
        EntryProblem::BadPort("65536".into())
    );
    assert_eq!(problem("a.com:+80"), EntryProblem::BadPort("+80".into()));
    assert_eq!(problem("a.com:"), EntryProblem::BadPort(String::new()));
    assert_eq!(
        problem("a.com:80:90"),
        EntryProblem::BadIpv6("a.com:80:90".into())
    );
    assert_eq!(problem("*"), EntryProblem::MatchAll);
    assert_eq!(problem("*:443"), EntryProblem::MatchAll);
    assert_eq!(problem("a.*.com"), EntryProblem::Wildcard);
    assert_eq!(problem("*a.com"), EntryProblem::Wildcard);
    assert_eq!(problem("*.*.com"), EntryProblem::Wildcard);
    assert_eq!(problem("a.com.*"), EntryProblem::Wildcard);
    assert_eq!(
        problem("Crates.IO"),
        EntryProblem::Uppercase("crates.io".into())
    );
    assert_eq!(problem("bücher.example"), EntryProblem::BadChar('ü'));
    assert_eq!(problem("a b.com"), EntryProblem::BadChar(' '));
    assert_eq!(problem("a..com"), EntryProblem::EmptyLabel);
    assert_eq!(problem(".a.com"), EntryProblem::EmptyLabel);
    assert_eq!(problem("a.com."), EntryProblem::EmptyLabel);
    assert_eq!(problem("-a.com"), EntryProblem::Hyphen);
    assert_eq!(
        problem(&format!("{}.com", "a".repeat(64))),
        EntryProblem::LabelTooLong { len: 64, max: 63 }
    );
    let long = vec!["a"; 127].join(".");
    assert_eq!(
        problem(&format!("{long}.b")),
        EntryProblem::NameTooLong { len: 255, max: 253 }
    );
    assert_eq!(problem("10.1.2"), EntryProblem::BadIpv4("10.1.2".into()));
    assert_eq!(
        problem("999.1.1.1"),
        EntryProblem::BadIpv4("999.1.1.1".into())
    );
    assert_eq!(
        problem("010.1.1.1"),
        EntryProblem::BadIpv4("010.1.1.1".into())
    );
    assert_eq!(
        problem("10.1.2.0/33"),
        EntryProblem::BadPrefix {
            prefix: "33".into(),
            max: 32
        }
    );
    assert_eq!(
        problem("10.1.2.0/"),
        EntryProblem::BadPrefix {
            prefix: String::new(),
            max: 32
        }
    );
    assert_eq!(
        problem("10.1.2.5/24"),
        EntryProblem::HostBits("10.1.2.0/24".into())
    );
    assert_eq!(
        problem("[fd00::1/8]:443"),
        EntryProblem::HostBits("fd00::/8".into())
    );
    assert_eq!(
        problem("fd00::/129"),
        EntryProblem::BadPrefix {
            prefix: "129".into(),
            max: 128
        }
    );
    assert_eq!(problem("[fd00::1"), EntryProblem::Brackets);
    assert_eq!(problem("[fd00::1]443"), EntryProblem::Brackets);
    assert_eq!(
        problem("[10.0.0.1]"),
        EntryProblem::BadIpv6("10.0.0.1".into())
    );
}

#[test]
fn a_253_byte_name_is_the_longest_accepted() {
    let longest = format!("{}.{}", vec!["a"; 125].join("."), "bcd");
    assert_eq!(longest.len(), 253);
    assert!(Entry::parse(&longest, "t:1".into()).is_ok());
    let longer = format!("a{longest}");
    assert_eq!(
        problem(&longer),
        EntryProblem::NameTooLong { len: 254, max: 253 }
    );
}

#[test]
fn compile_errors_name_the_list_entry_and_source() {
    let error =
        Rules::compile(&[spec("ok.com", 3)], &[spec("a..b", 9)]).expect_err("bad deny entry");
    assert_eq!(
        error.to_string(),
        "failed to parse network deny entry \"a..b\" (policy.toml:9): the name has an empty \
         label (two dots in a row, or a leading or trailing dot)"
    );
    let error = Rules::compile(&[spec(&"x".repeat(200), 4)], &[]).expect_err("bad allow entry");
    let text = error.to_string();
    assert!(text.contains(&format!("\"{}…\"", "x".repeat(80))), "{text}");
    assert!(text.contains("(policy.toml:4)"), "{text}");
}

#[test]
fn entry_count_is_bounded() {
    let many: Vec<_> = (0..=MAX_ENTRIES)
        .map(|i| spec(&format!("h{i}.example"), i))
        .collect();
    let error = Rules::compile(&many, &[]).expect_err("too many entries");
    assert_eq!(
        error.to_string(),
        "failed to compile network allow list: it has 4097 entries, the limit is 4096"
    );
    assert!(Rules::compile(&many[..MAX_ENTRIES], &[]).is_ok());
}

#[test]
fn a_name_without_port_means_80_and_443() {
    let rules = rules(&["crates.io"], &[]);
    assert_eq!(
        rules.decide(&name("crates.io"), 443),
        Decision::Allowed(matched("crates.io", "policy.toml:1"))
    );
    assert_eq!(
        rules.decide(&name("crates.io"), 80),
        Decision::Allowed(matched("crates.io", "policy.toml:1"))
    );
    assert_eq!(rules.decide(&name("crates.io"), 22), Decision::NotAllowed);
    assert_eq!(
        rules.decide(&name("static.crates.io"), 443),
        Decision::NotAllowed
    );
    assert_eq!(rules.decide(&name("xcrates.io"), 443), Decision::NotAllowed);
}

#[test]
fn port_entries_cover_only_their_port() {
    let rules = rules(&["github.com:22", "10.1.2.0/24:5432"], &[]);
    assert!(matches!(
        rules.decide(&name("github.com"), 22),
        Decision::Allowed(_)
    ));
    assert_eq!(rules.decide(&name("github.com"), 443), Decision::NotAllowed);
    assert!(matches!(
        rules.decide(&name("10.1.2.77"), 5432),
        Decision::Allowed(_)
    ));
    assert_eq!(rules.decide(&name("10.1.2.77"), 5433), Decision::NotAllowed);
    assert_eq!(rules.decide(&name("10.1.3.1"), 5432), Decision::NotAllowed);
}

#[test]
fn wildcards_match_subdomains_not_the_apex() {
    let rules = rules(&["*.crates.io"], &[]);
    let allowed = Decision::Allowed(matched("*.crates.io", "policy.toml:1"));
    assert_eq!(rules.decide(&name("static.crates.io"), 443), allowed);
    assert_eq!(rules.decide(&name("a.b.crates.io"), 80), allowed);
    assert_eq!(rules.decide(&name("crates.io"), 443), Decision::NotAllowed);
    assert_eq!(
        rules.decide(&name("evilcrates.io"), 443),
        Decision::NotAllowed
    );
    assert_eq!(
        rules.decide(&name("crates.io.evil.com"), 443),
        Decision::NotAllowed
    );
    assert_eq!(
        rules.decide(&name("static.crates.io"), 8080),
        Decision::NotAllowed
    );
}

#[test]
fn deny_beats_allow_and_names_its_entry() {
    let rules = rules(
        &["*.example.com", "10.0.0.0/8"],
        &["*.internal.example.com", "10.9.0.0/16"],
    );
    assert_eq!(
        rules.decide(&name("db.internal.example.com"), 443),
        Decision::Denied(matched("*.internal.example.com", "policy.toml:101"))
    );
    assert!(matches!(
        rules.decide(&name("www.example.com"), 443),
        Decision::Allowed(_)
    ));
    assert_eq!(
        rules.decide(&name("10.9.1.1"), 80),
        Decision::Denied(matched("10.9.0.0/16", "policy.toml:102"))
    );
    assert!(matches!(
        rules.decide(&name("10.8.1.1"), 80),
        Decision::Allowed(_)
    ));
}

#[test]
fn ip_literals_match_only_ip_entries_and_names_only_name_entries() {
    let rules = rules(&["93.184.215.14", "example.com"], &[]);
    assert!(matches!(
        rules.decide(&name("93.184.215.14"), 443),
        Decision::Allowed(_)
    ));
    // the address example.com has is not allowed by the name entry
    assert_eq!(
        rules.decide(&name("93.184.215.15"), 443),
        Decision::NotAllowed
    );
    // a name never matches an IP entry
    let rules = self::rules(&["10.0.0.0/8"], &[]);
    assert_eq!(
        rules.decide(&name("ten.example"), 443),
        Decision::NotAllowed
    );
}

#[test]
fn requested_names_are_normalised_and_checked() {
    assert_eq!(
        Host::parse("Static.Crates.IO.").expect("parses"),
        Host::Name("static.crates.io".into())
    );
    assert_eq!(
        Host::parse("::ffff:127.0.0.1").expect("parses"),
        Host::Ip("127.0.0.1".parse().expect("ip"))
    );
    assert_eq!(Host::parse("a..b"), Err(EntryProblem::EmptyLabel));
    assert_eq!(
        Host::parse("127.1"),
        Err(EntryProblem::BadIpv4("127.1".into()))
    );
    assert_eq!(
        Host::parse("2130706433"),
        Err(EntryProblem::BadIpv4("2130706433".into()))
    );
    assert_eq!(Host::parse("*.a.com"), Err(EntryProblem::Wildcard));
    assert_eq!(Host::parse("a\0b"), Err(EntryProblem::BadChar('\0')));
    assert!(matches!(
        Host::parse(&"a".repeat(100_000)),
        Err(EntryProblem::NameTooLong { .. })
    ));
    // a trailing dot does not slip past a deny entry
    let rules = rules(&["*.example.com"], &["evil.example.com"]);
    assert!(matches!(
        rules.decide(&name("EVIL.example.com."), 443),
        Decision::Denied(_)
    ));
}

#[test]
fn special_ranges_are_classified() {
    let cases = [
        ("127.0.0.1", Some(SpecialRange::Loopback)),
        ("127.255.255.254", Some(SpecialRange::Loopback)),
        ("::1", Some(SpecialRange::Loopback)),
        ("10.0.0.1", Some(SpecialRange::Private)),
        ("172.16.0.1", Some(SpecialRange::Private)),
        ("172.31.255.255", Some(SpecialRange::Private)),
        ("192.168.1.1", Some(SpecialRange::Private)),
        ("fc00::1", Some(SpecialRange::Private)),
        ("fdff::1", Some(SpecialRange::Private)),
        ("169.254.169.254", Some(SpecialRange::LinkLocal)),
        ("fe80::1", Some(SpecialRange::LinkLocal)),
        ("febf::1", Some(SpecialRange::LinkLocal)),
        ("100.64.0.1", Some(SpecialRange::SharedCgnat)),
        ("100.127.255.255", Some(SpecialRange::SharedCgnat)),
        ("0.0.0.0", Some(SpecialRange::Unspecified)),
        ("0.1.2.3", Some(SpecialRange::Unspecified)),
        ("::", Some(SpecialRange::Unspecified)),
        ("224.0.0.1", Some(SpecialRange::Multicast)),
        ("239.255.255.255", Some(SpecialRange::Multicast)),
        ("ff02::1", Some(SpecialRange::Multicast)),
        ("255.255.255.255", Some(SpecialRange::Broadcast)),
        ("::ffff:127.0.0.1", Some(SpecialRange::Loopback)),
        ("::ffff:169.254.169.254", Some(SpecialRange::LinkLocal)),
        ("::ffff:10.1.1.1", Some(SpecialRange::Private)),
        ("192.0.0.8", Some(SpecialRange::Reserved)),
        ("198.18.0.1", Some(SpecialRange::Reserved)),
        ("198.19.255.255", Some(SpecialRange::Reserved)),
        ("240.0.0.1", Some(SpecialRange::Reserved)),
        (
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            Some(SpecialRange::Reserved),
        ),
        ("::ffff:198.18.0.1", Some(SpecialRange::Reserved)),
        ("192.0.1.1", None),
        ("198.20.0.1", None),
        ("2001:db9::1", None),
        ("8.8.8.8", None),
        ("172.32.0.1", None),
        ("100.128.0.1", None),
        ("100.63.255.255", None),
        ("2606:4700::1111", None),
        ("fec0::1", None),
    ];
    for (ip, range) in cases {
        assert_eq!(special_range(ip.parse().expect("ip")), range, "{ip}");
    }
}

#[test]
fn ipv6_forms_that_carry_an_ipv4_address_are_classified_by_it() {
    // NAT64 (a DNS64 resolver hands these out; the translator connects to the IPv4 address),
    // 6to4 and IPv4-compatible addresses lead to the embedded address.
    let cases = [
        ("64:ff9b::7f00:1", Some(SpecialRange::Loopback)),
        ("64:ff9b::a9fe:a9fe", Some(SpecialRange::LinkLocal)),
        ("64:ff9b::a00:5", Some(SpecialRange::Private)),
        ("64:ff9b::c0a8:101", Some(SpecialRange::Private)),
        ("64:ff9b::6440:1", Some(SpecialRange::SharedCgnat)),
        ("64:ff9b::808:808", None),
        // The local-use NAT64 prefix is a network's own translator: inside, always.
        ("64:ff9b:1::a00:5", Some(SpecialRange::Private)),
        ("64:ff9b:1:203:4:500::", Some(SpecialRange::Private)),
        ("2002:7f00:1::", Some(SpecialRange::Loopback)),
        ("2002:a9fe:a9fe::1", Some(SpecialRange::LinkLocal)),
        ("2002:a00:5:1::1", Some(SpecialRange::Private)),
        ("2002:808:808::1", None),
        ("::7f00:1", Some(SpecialRange::Loopback)),
        ("::a9fe:a9fe", Some(SpecialRange::LinkLocal)),
        ("::808:808", None),
    ];
    for (ip, range) in cases {
        assert_eq!(special_range(ip.parse().expect("ip")), range, "{ip}");
    }
    // An IPv4 entry does not reach through these forms: only an IPv6 entry allows them.
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let with_loopback = rules(&["pkg.test", "127.0.0.0/8"], &[]);
    assert_eq!(
        with_loopback.check_address(ip("64:ff9b::7f00:1"), 443),
        AddressCheck::Special(SpecialRange::Loopback)
    );
    let with_nat64 = rules(&["pkg.test", "[64:ff9b::a00:0/120]:443"], &[]);
    assert_eq!(
        with_nat64.check_address(ip("64:ff9b::a00:5"), 443),
        AddressCheck::Pass
    );
}

#[test]
fn resolved_special_addresses_need_an_ip_allow_entry() {
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let plain = rules(&["pkg.test"], &[]);
    assert_eq!(
        plain.check_address(ip("127.0.0.1"), 443),
        AddressCheck::Special(SpecialRange::Loopback)
    );
    assert_eq!(
        plain.check_address(ip("::ffff:169.254.169.254"), 80),
        AddressCheck::Special(SpecialRange::LinkLocal)
    );
    assert_eq!(
        plain.check_address(ip("93.184.215.14"), 443),
        AddressCheck::Pass
    );

    let with_loopback = rules(&["pkg.test", "127.0.0.0/8"], &[]);
    assert_eq!(
        with_loopback.check_address(ip("127.0.0.9"), 443),
        AddressCheck::Pass
    );
    assert_eq!(
        with_loopback.check_address(ip("::ffff:127.0.0.9"), 443),
        AddressCheck::Pass
    );
    assert_eq!(
        with_loopback.check_address(ip("::1"), 443),
        AddressCheck::Special(SpecialRange::Loopback)
    );

    let port_bound = rules(&["pkg.test", "127.0.0.1/32:8080"], &[]);
    assert_eq!(
        port_bound.check_address(ip("127.0.0.1"), 8080),
        AddressCheck::Pass
    );
    assert_eq!(
        port_bound.check_address(ip("127.0.0.1"), 8081),
        AddressCheck::Special(SpecialRange::Loopback)
    );

    let denied = rules(&["pkg.test"], &["93.184.0.0/16"]);
    assert_eq!(
        denied.check_address(ip("93.184.215.14"), 443),
        AddressCheck::Denied(matched("93.184.0.0/16", "policy.toml:101"))
    );
}

#[test]
fn suggestions_are_valid_entries() {
    let cases = [
        (name("pkg.test"), 443, "pkg.test"),
        (name("pkg.test"), 8080, "pkg.test:8080"),
        (name("10.1.1.1"), 22, "10.1.1.1:22"),
        (name("fd00::1"), 443, "[fd00::1]:443"),
    ];
    for (host, port, want) in cases {
        let suggestion = suggested_entry(&host, port);
        assert_eq!(suggestion, want);
        let rules = rules(&[&suggestion], &[]);
        assert!(
            matches!(rules.decide(&host, port), Decision::Allowed(_)),
            "{want}"
        );
    }
    let ip = "127.0.0.1".parse().expect("ip");
    let suggestion = suggested_address_entry(ip, 8080);
    assert_eq!(suggestion, "127.0.0.1/32:8080");
    assert_eq!(
        rules(&[&suggestion], &[]).check_address(ip, 8080),
        AddressCheck::Pass
    );
    let ip6 = "fd00::5".parse().expect("ip");
    let suggestion = suggested_address_entry(ip6, 443);
    assert_eq!(
        rules(&[&suggestion], &[]).check_address(ip6, 443),
        AddressCheck::Pass
    );
}

#[test]
fn garbage_entries_and_hosts_never_panic() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let alphabet = b"ab9.-*:[]/_%\0\xff0123456789fdAZ ";
    for _ in 0..20_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = (state % 24) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|i| alphabet[((state >> (i % 8 * 8)) as usize + i) % alphabet.len()])
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        let _ = Entry::parse(&text, "fuzz:1".into());
        let _ = Host::parse(&text);
    }
}

#[test]
fn ask_entries_come_after_deny_and_allow() {
    let rules = rules(&["pkg.example.com"], &["evil.example.com"])
        .with_ask(&[spec("*.example.com", 201), spec("10.9.0.0/16:5432", 202)])
        .expect("ask list compiles");
    assert_eq!(
        rules.decide(&name("pkg.example.com"), 443),
        Decision::Allowed(matched("pkg.example.com", "policy.toml:1"))
    );
    assert_eq!(
        rules.decide(&name("evil.example.com"), 443),
        Decision::Denied(matched("evil.example.com", "policy.toml:101"))
    );
    assert_eq!(
        rules.decide(&name("docs.example.com"), 443),
        Decision::Ask(matched("*.example.com", "policy.toml:201"))
    );
    assert_eq!(
        rules.decide(&name("docs.example.com"), 22),
        Decision::NotAllowed
    );
    assert_eq!(
        rules.decide(&name("example.com"), 443),
        Decision::NotAllowed
    );
    assert_eq!(
        rules.decide(&Host::parse("10.9.1.2").expect("ip"), 5432),
        Decision::Ask(matched("10.9.0.0/16:5432", "policy.toml:202"))
    );
}

#[test]
fn an_ask_entry_does_not_let_a_name_resolve_into_a_special_range() {
    let rules = rules(&["pkg.test"], &[])
        .with_ask(&[spec("10.9.0.0/16", 201)])
        .expect("ask list compiles");
    assert_eq!(
        rules.check_address("10.9.1.2".parse().expect("ip"), 443),
        AddressCheck::Special(SpecialRange::Private)
    );
}

#[test]
fn ask_compile_errors_name_the_ask_list() {
    let error = Rules::default()
        .with_ask(&[spec("B@d", 7)])
        .expect_err("bad ask entry");
    assert!(
        error
            .to_string()
            .starts_with("failed to parse network ask entry \"B@d\" (policy.toml:7)"),
        "{error}"
    );
}
