//! Counters declared once: [`counters!`] writes, from one list of documented names, a plain struct of `u64`s (what reports, JSON and `stats` read), its
//! shared twin of atomics (what threads count into), and the walk over both that the
//! Prometheus exposition and the terminal tables use. A server that adds a counter adds
//! one line; no second struct, no copy field by field, no name written twice.

/// A set of named counters: each with its name, its help text (the field's doc comment)
/// and its value. Made by [`counters!`].
pub trait CounterSet {
    /// Calls `f` with each counter's name, help text and value, in declaration order.
    fn each(&self, f: &mut dyn FnMut(&'static str, &'static str, u64));
}

/// Declares counters once.
///
/// ```
/// netlane_counters::counters! {
///     /// What a listener saw.
///     #[derive(Hash)]
///     pub struct Seen, shared SharedSeen {
///         /// Connections taken.
///         accepted,
///         /// Connections refused.
///         refused,
///     }
/// }
/// let shared = SharedSeen::default();
/// shared.accepted.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
/// let seen: Seen = shared.load();
/// assert_eq!(seen, Seen { accepted: 2, refused: 0 });
/// let mut names = Vec::new();
/// netlane_counters::CounterSet::each(&seen, &mut |name, _help, v| names.push((name, v)));
/// assert_eq!(names, [("accepted", 2), ("refused", 0)]);
/// ```
///
/// The plain struct (`Seen`) derives `Debug`, `Default`, `Clone`, `Copy`, `PartialEq`
/// and `Eq`, plus the attributes given (for example `serde::Serialize` or
/// `schemars::JsonSchema`; the field docs become the schema's descriptions). It has
/// `add` and `minus`, and implements [`CounterSet`]. The shared struct (`SharedSeen`)
/// has a public `AtomicU64` per counter, for threads that count with `fetch_add`, and
/// `load` (a snapshot), `publish` (a single writer stores its plain copy) and `add` (adds
/// a plain copy in).
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, shared $shared:ident {
            $($(#[doc = $doc:literal])* $field:ident,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        $vis struct $name {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        #[doc = concat!("The shared, atomic twin of [`", stringify!($name), "`].")]
        #[derive(Debug, Default)]
        $vis struct $shared {
            $($(#[doc = $doc])* pub $field: ::std::sync::atomic::AtomicU64,)*
        }

        impl $name {
            /// Adds `o` into `self`, counter by counter.
            pub fn add(&mut self, o: &$name) {
                $(self.$field += o.$field;)*
            }

            /// `self - o`, counter by counter, floored at 0.
            pub fn minus(&self, o: &$name) -> $name {
                $name { $($field: self.$field.saturating_sub(o.$field),)* }
            }
        }

        impl $crate::CounterSet for $name {
            fn each(&self, f: &mut dyn FnMut(&'static str, &'static str, u64)) {
                $(f(stringify!($field), concat!($($doc),*).trim(), self.$field);)*
            }
        }

        impl $shared {
            /// A snapshot of every counter.
            pub fn load(&self) -> $name {
                $name { $($field: self.$field.load(::std::sync::atomic::Ordering::Relaxed),)* }
            }

            /// Stores `c` (for a single writer that counts into a plain copy).
            pub fn publish(&self, c: &$name) {
                $(self.$field.store(c.$field, ::std::sync::atomic::Ordering::Relaxed);)*
            }

            /// Adds `c` in, counter by counter.
            pub fn add(&self, c: &$name) {
                $(self.$field.fetch_add(c.$field, ::std::sync::atomic::Ordering::Relaxed);)*
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::CounterSet;

    crate::counters! {
        /// Two counters.
        struct Two, shared SharedTwo {
            /// The first
            /// of them.
            first,
            /// The second.
            second,
        }
    }

    #[test]
    fn help_is_the_doc_comment_and_shared_copies_round_trip() {
        let s = SharedTwo::default();
        s.first.fetch_add(3, Ordering::Relaxed);
        s.add(&Two { first: 1, second: 5 });
        let t = s.load();
        assert_eq!(t, Two { first: 4, second: 5 });
        assert_eq!(t.minus(&Two { first: 9, second: 1 }), Two { first: 0, second: 4 });
        let mut sum = t;
        sum.add(&Two { first: 1, second: 0 });
        assert_eq!(sum, Two { first: 5, second: 5 });
        let mut seen = Vec::new();
        t.each(&mut |n, h, v| seen.push((n, h.to_string(), v)));
        assert_eq!(seen[0], ("first", "The first of them.".to_string(), 4));
        assert_eq!(seen[1], ("second", "The second.".to_string(), 5));
        s.publish(&Two::default());
        assert_eq!(s.load(), Two::default());
    }
}
