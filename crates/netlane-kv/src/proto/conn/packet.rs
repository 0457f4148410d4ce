//! Binary-protocol packets on a connection: a header checked before its body is read,
//! a storage command's value buffered whole, any other body skipped as it comes.

use super::{Conn, Progress, Turn};
use crate::proto::binary::{self, Check};
use crate::proto::exec::{After, Ctx};

impl Conn {
    /// One binary packet: run it if it has arrived ([`Progress::Ran`]: go on), or say
    /// what the driver should do. The value of a storage command is buffered whole (it
    /// is at most the item size limit); any other body past the key is skipped as it
    /// comes.
    pub(super) fn binary_step(&mut self, ctx: &mut Ctx<'_>) -> Progress {
        let avail = &self.input[self.start..self.end];
        let Some(h) = binary::Header::parse(avail) else {
            self.need = binary::HEADER;
            return Progress::Stop(Turn::NeedRead);
        };
        let head = binary::HEADER + usize::from(h.extlen) + usize::from(h.keylen);
        let storage = h.is_storage();
        match binary::check(&h, self.item_max) {
            Check::Close => {
                self.closing = true;
                Progress::Stop(Turn::Close)
            }
            Check::Fatal(s) => {
                binary::refuse(ctx, &h, None, Check::Fatal(s), &mut self.output);
                self.closing = true;
                Progress::Stop(Turn::Close)
            }
            Check::Refuse(s) => {
                binary::refuse(ctx, &h, None, Check::Refuse(s), &mut self.output);
                self.start += binary::HEADER;
                self.swallow = h.bodylen as usize;
                self.need = 0;
                Progress::Ran
            }
            c @ (Check::TooLarge | Check::NoMemory) => {
                if avail.len() < head {
                    self.need = head;
                    return Progress::Stop(Turn::NeedRead);
                }
                let key_at = self.start + binary::HEADER + usize::from(h.extlen);
                let (start, input) = (self.start, std::mem::take(&mut self.input));
                binary::refuse(ctx, &h, Some(&input[key_at..start + head]), c, &mut self.output);
                self.input = input;
                self.start += head;
                self.swallow = h.value_len();
                self.need = 0;
                Progress::Ran
            }
            Check::Run => {
                let wanted = if storage { binary::HEADER + h.bodylen as usize } else { head };
                let have = avail.len();
                if have < wanted {
                    if storage && have >= head && !self.room_for_value(wanted) {
                        // No memory for the value: refused as memcached refuses it.
                        let key_at = self.start + binary::HEADER + usize::from(h.extlen);
                        let (start, input) = (self.start, std::mem::take(&mut self.input));
                        binary::refuse(ctx, &h, Some(&input[key_at..start + head]), Check::NoMemory, &mut self.output);
                        self.input = input;
                        self.start += head;
                        self.swallow = h.value_len();
                        self.need = 0;
                        return Progress::Ran;
                    }
                    // A value's room is charged once its key has arrived.
                    self.need = if storage && have < head { head } else { wanted };
                    return Progress::Stop(Turn::NeedRead);
                }
                self.need = 0;
                let (start, input) = (self.start, std::mem::take(&mut self.input));
                let after = binary::run(ctx, &h, &input[start + binary::HEADER..start + wanted], &mut self.output);
                self.input = input;
                self.start += wanted;
                if !storage {
                    self.swallow = h.value_len();
                }
                if after == After::Close {
                    self.closing = true;
                    return Progress::Stop(Turn::Close);
                }
                Progress::Ran
            }
        }
    }
}
