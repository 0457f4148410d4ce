//! Records made and undone, against files of a temporary directory.

use super::*;

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("netlane-installed-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

#[test]
fn records_of_live_processes_stay_and_dead_ones_are_undone() {
    let d = dir("records");
    let value = d.join("value");
    fs::create_dir_all(&d).unwrap();
    fs::write(&value, "1\n").unwrap();
    let place = Place::here().unwrap();
    let change = Change::Sysctl { place, path: value.clone(), before: "0".into(), value: "1".into() };
    // Ours (alive): a clean leaves it, and a dead process's record of the same
    // sysctl (pid 2^22 + 1 is above the kernel's limit) is left while we hold it.
    let mine = record_in(&d, &change).unwrap();
    let text = serde_json::to_string(&change).unwrap();
    fs::write(d.join("4194305-0.json"), text).unwrap();
    assert!(clean_stale_in(&d).unwrap().is_empty());
    assert_eq!(fs::read_to_string(&value).unwrap(), "1\n");
    // Dropping our record removes it; then the dead one is undone and removed.
    drop(mine);
    assert_eq!(fs::read_dir(&d).unwrap().count(), 2, "the value file and the dead record");
    let cleaned = clean_stale_in(&d).unwrap();
    assert_eq!(cleaned.len(), 1);
    assert_eq!(cleaned[0].pid, 4_194_305);
    assert_eq!(cleaned[0].outcome, Ok("restored to 0".into()));
    assert_eq!(fs::read_to_string(&value).unwrap(), "0");
    assert!(!d.join("4194305-0.json").exists());
    // A value someone changed since is left alone; files that are not records too.
    fs::write(&value, "7").unwrap();
    fs::write(d.join("4194305-1.json"), serde_json::to_string(&change).unwrap()).unwrap();
    fs::write(d.join("4194305-2.json"), "not json").unwrap();
    let cleaned = clean_stale_in(&d).unwrap();
    assert_eq!(cleaned[0].outcome, Ok("left alone: it is 7 now".into()));
    assert_eq!(fs::read_to_string(&value).unwrap(), "7");
    assert!(d.join("4194305-2.json").exists());
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn device_settings_of_a_device_that_is_gone_went_with_it() {
    let place = Place::here().unwrap();
    let v = |n: u32| Values::from([("combined".to_string(), n)]);
    let ethtool =
        Change::Ethtool { place, ifname: "nosuch0".into(), group: Group::Channels, before: v(8), value: v(2) };
    assert_eq!(ethtool.to_string(), "channels of nosuch0: combined=2 (was combined=8)");
    assert_eq!(undo(&ethtool), Ok("gone with its device".into()));
    let irq = Change::IrqAffinity { irq: 999_999, before: "0-1".into(), value: "1".into() };
    assert_eq!(irq.to_string(), "IRQ 999999 on CPUs 1 (was 0-1)");
    assert_eq!(undo(&irq), Ok("gone with its device".into()));
    // A record reads back as the change it was.
    let text = serde_json::to_string(&ethtool).unwrap();
    assert_eq!(serde_json::from_str::<Change>(&text).unwrap(), ethtool);
}

/// A record names its process by pid and start time: another process that was
/// given the same pid later does not keep it alive.
#[test]
fn a_reused_pid_does_not_keep_a_record_alive() {
    let d = dir("reused");
    let value = d.join("value");
    fs::create_dir_all(&d).unwrap();
    fs::write(&value, "1").unwrap();
    let change =
        Change::Sysctl { place: Place::here().unwrap(), path: value.clone(), before: "0".into(), value: "1".into() };
    let me = std::process::id();
    let mine = record_in(&d, &change).unwrap();
    let started = start_time(me).unwrap();
    assert!(mine.path.file_name().unwrap().to_str().unwrap().starts_with(&format!("{me}-{started}-")));
    assert!(clean_stale_in(&d).unwrap().is_empty(), "ours is alive");
    mine.keep();
    // The same pid with another start time: a process that ended, its pid reused.
    fs::rename(
        fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "json"))
            .unwrap(),
        d.join(format!("{me}-{}-0.json", started + 1)),
    )
    .unwrap();
    let cleaned = clean_stale_in(&d).unwrap();
    assert_eq!(cleaned.len(), 1, "{cleaned:?}");
    assert_eq!(cleaned[0].outcome, Ok("restored to 0".into()));
    let _ = fs::remove_dir_all(&d);
}

/// A process's changes are undone newest first, whatever their numbers' spelling: the
/// same sysctl changed twice goes back to what it was before the first change.
#[test]
fn a_dead_processs_changes_are_undone_newest_first() {
    let d = dir("order");
    let value = d.join("value");
    fs::create_dir_all(&d).unwrap();
    fs::write(&value, "2").unwrap();
    let place = Place::here().unwrap();
    let first = Change::Sysctl { place: place.clone(), path: value.clone(), before: "0".into(), value: "1".into() };
    let second = Change::Sysctl { place, path: value.clone(), before: "1".into(), value: "2".into() };
    // Sequence 2 before 10 (a name sort would take 10 first).
    fs::write(d.join("4194305-0-2.json"), serde_json::to_string(&first).unwrap()).unwrap();
    fs::write(d.join("4194305-0-10.json"), serde_json::to_string(&second).unwrap()).unwrap();
    let cleaned = clean_stale_in(&d).unwrap();
    let outcomes: Vec<_> = cleaned.iter().map(|c| c.outcome.clone()).collect();
    assert_eq!(outcomes, [Ok("restored to 1".to_string()), Ok("restored to 0".to_string())]);
    assert_eq!(fs::read_to_string(&value).unwrap(), "0");
    let _ = fs::remove_dir_all(&d);
}
