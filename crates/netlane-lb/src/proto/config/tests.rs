//! The configuration's tests: a good file with its defaults, bad ones that say what and
//! where, diffs, and syntax errors quoted short.

use super::*;

const GOOD: &str = r#"
        [[vip]]
        address = "10.100.0.1"
        port = 80
        proto = "tcp"
        [[vip.real]]
        address = "10.200.0.2"
        [[vip.real]]
        address = "10.200.0.3"
        weight = 2
        [[vip.real]]
        address = "fd00:200::4"
        weight = 4

        [[vip]]
        address = "fd00:100::1"
        proto = "udp"
        [[vip.real]]
        address = "fd00:200::4"
    "#;

#[test]
fn a_good_config_parses_with_defaults() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.ring_size, 65537);
    assert_eq!(c.vips.len(), 2);
    assert_eq!(c.vips[0].reals[0].weight, 1);
    assert_eq!(c.vips[1].port, 0);
    assert_eq!(c.vips[1].name(), "[fd00:100::1]:*/udp");
    assert!(c.vip("10.100.0.1".parse().unwrap(), 80, Proto::Tcp).is_some());
}

#[test]
fn bad_configs_say_what_and_where() {
    let cases = [
        ("ring_size = 65536\n", "prime"),
        ("ring_size = 4294967291\n", "largest ring"),
        ("conn_entries = 4294967295\n", "conn_entries"),
        ("", "no [[vip]]"),
        ("[[vip]]\naddress = \"10.0.0.1\"\nproto = \"sctp\"\n", "sctp"),
        ("[[vip]]\naddress = \"10.0.0.1\"\nproto = \"tcp\"\n", "has no [[vip.real]]"),
        ("[[vip]]\naddress = \"10.0.0.1\"\nproto = \"tcp\"\ncolour = 1\n", "colour"),
        ("[[vip]]\naddress = \"10.0.0.300\"\nproto = \"tcp\"\n", "invalid"),
        (
            "[[vip]]\naddress = \"fd00::1\"\nproto = \"tcp\"\n[[vip.real]]\naddress = \"10.0.0.2\"\n",
            "IPv6 VIP cannot use the IPv4 real 10.0.0.2",
        ),
        (
            "[[vip]]\naddress = \"10.0.0.1\"\nproto = \"tcp\"\n[[vip.real]]\naddress = \"10.0.0.2\"\n[[vip.real]]\naddress = \"10.0.0.2\"\n",
            "listed twice",
        ),
        (
            "[[vip]]\naddress = \"10.0.0.1\"\nproto = \"tcp\"\n[[vip.real]]\naddress = \"10.0.0.2\"\nweight = 5000\n",
            "above 1000",
        ),
        (
            "[[vip]]\naddress = \"10.0.0.1\"\nproto = \"tcp\"\n[[vip.real]]\naddress = \"10.0.0.2\"\nweight = 0\n",
            "every real has weight 0",
        ),
        ("[[vip]]\naddress = \"0.0.0.0\"\nproto = \"tcp\"\n[[vip.real]]\naddress = \"10.0.0.2\"\n", "cannot be a VIP"),
    ];
    for (text, want) in cases {
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: {e}");
    }
    let twice = format!(
        "{GOOD}\n[[vip]]\naddress = \"10.100.0.1\"\nport = 80\nproto = \"tcp\"\n[[vip.real]]\naddress = \"10.0.0.9\"\n"
    );
    assert!(Config::parse(&twice).unwrap_err().to_string().contains("10.100.0.1:80/tcp is configured twice"));
    // More reals than tags can name (built, not parsed: 2^19 + 1 reals).
    let mut big = Config::parse(GOOD).unwrap();
    big.ring_size = maglev::MAX_RING;
    let real = big.vips[0].reals[0].clone();
    for v in 0..9u32 {
        let mut vip = big.vips[0].clone();
        vip.port = 1000 + v as u16;
        vip.reals = (0..(MAX_REALS_TOTAL / 8).min(maglev::MAX_RING))
            .map(|i| Real { address: IpAddr::from((0x0a00_0000 + v * 0x10_0000 + i).to_be_bytes()), ..real.clone() })
            .collect();
        big.vips.push(vip);
    }
    let e = big.validate().unwrap_err().to_string();
    assert!(e.contains("reals in all; at most 524288"), "{e}");
    // Rings that would not fit in memory: 5,000 VIPs of 65,537 slots.
    let mut many = Config::parse(GOOD).unwrap();
    let one = many.vips[0].clone();
    many.vips = (0..5000u16).map(|p| Vip { port: p + 1, ..one.clone() }).collect();
    let e = many.validate().unwrap_err().to_string();
    assert!(e.contains("327685000 ring slots (1250 MiB)"), "{e}");
}

#[test]
fn diffs_report_real_changes_and_moved_slots() {
    let old = Config::parse(GOOD).unwrap();
    let mut new = old.clone();
    new.vips[0].reals.remove(1); // 10.200.0.3 (2/7 of the ring) goes
    new.vips[0].reals[0].weight = 3;
    let d = diff(&old, &new).unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].removed, vec!["10.200.0.3".parse::<IpAddr>().unwrap()]);
    assert_eq!(d[0].reweighted, vec!["10.200.0.2".parse::<IpAddr>().unwrap()]);
    assert!(d[0].slots_moved >= 65537 * 2 / 7, "{}", d[0].slots_moved);
    assert!(diff(&old, &old).unwrap().is_empty());
    let mut gone = old.clone();
    gone.vips.remove(1);
    let d = diff(&old, &gone).unwrap();
    assert_eq!((d.len(), d[0].slots_moved), (1, 65537));
}

#[test]
fn a_syntax_error_quotes_a_short_excerpt_however_long_the_line() {
    let long = format!("ring_size = 65537\n[[vip]]\naddress = \"10.0.0.1\" {} oops\n", "x".repeat(20 << 20));
    let e = Config::parse(&long).unwrap_err().to_string();
    assert!(e.len() < 400, "{} bytes: {}", e.len(), &e[..400.min(e.len())]);
    assert!(e.starts_with("line 3, column "), "{e}");
    assert!(e.contains("(near `") && e.contains("xxx"), "{e}");
    // A huge value quoted by the type error is cut too.
    let huge = format!("ring_size = \"{}\"\n", "9".repeat(1 << 20));
    let e = Config::parse(&huge).unwrap_err().to_string();
    assert!(e.len() < 800, "{} bytes", e.len());
    assert!(e.starts_with("line 1, column 13: "), "{e}");
    let e = Config::parse("ring_size = 7\n[[vip]]\naddress = \"10.0.0.1\"\nport = 80\nproto = \"tcq\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 5, column 9: ") && e.contains("tcq"), "{e}");
    assert_eq!(bounded("héllo", 2), "h... (6 bytes)");
}
