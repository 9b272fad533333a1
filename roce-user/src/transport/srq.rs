//! Shared receive queues (`struct ibv_srq`; IBA 10.2.9 and 11.2.3, rxe_srq.c).
//!
//! An SRQ is a receive queue that several QPs of one device draw from: a QP created with an
//! SRQ ([`super::Device::create_qp_with_srq`]) has no receive queue of its own, its responder
//! takes the SRQ's oldest WQE when a request needs one (the first packet of a SEND, a WRITE
//! with immediate; rxe `get_srq_wqe`), so WQEs are consumed in the order messages arrive over
//! all the QPs. An empty SRQ makes an RC responder answer with an RNR NAK (rxe `RESPST_ERR_RNR`)
//! and a UD responder drop the datagram.
//!
//! The limit (`srq_limit`, armed by [`super::Device::modify_srq`] with [`SrqAttrMask::LIMIT`]
//! or at creation, as rxe does): when taking a WQE leaves fewer than `srq_limit` WQEs, the
//! device raises [`super::Event::SrqLimitReached`] once and disarms the limit (the value reads
//! 0 afterwards, `ibv_query_srq(3)`), until it is armed again. Like rxe, arming a limit above
//! the current count raises nothing until the next WQE is taken.
//!
//! # Memory bound
//! At most [`super::DeviceConfig::max_srq`] SRQs of at most `max_srq_wr` WQEs each, posted by
//! the local application only; a WQE is 32 B plus 16 B per SGE.

use std::collections::VecDeque;

use super::mr::PdId;
use super::wr::RecvWr;
use super::{DeviceError, PostError};

/// Identifies an SRQ of a device.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct SrqId(pub u32);

/// The attributes of an SRQ (`struct ibv_srq_attr`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SrqAttr {
    /// WQEs the SRQ holds at most.
    pub max_wr: u32,
    /// Scatter/gather entries per WQE.
    pub max_sge: u32,
    /// The armed limit, 0 when not armed.
    pub srq_limit: u32,
}

bitflags::bitflags! {
    /// Which attributes `modify_srq` sets (`enum ibv_srq_attr_mask`).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize, serde::Deserialize)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR`: resize the queue.
        const MAX_WR = 1 << 0;
        /// `IBV_SRQ_LIMIT`: arm the limit event.
        const LIMIT = 1 << 1;
    }
}

/// One shared receive queue.
#[derive(Debug)]
pub struct Srq {
    pd: PdId,
    attr: SrqAttr,
    wqes: VecDeque<RecvWr>,
}

impl Srq {
    pub(crate) const fn new(pd: PdId, attr: SrqAttr) -> Self {
        Self {
            pd,
            attr,
            wqes: VecDeque::new(),
        }
    }

    /// The protection domain it was made in.
    #[must_use]
    pub const fn pd(&self) -> PdId {
        self.pd
    }

    /// Its attributes (`ibv_query_srq`): `srq_limit` is 0 once the limit event fired.
    #[must_use]
    pub const fn attr(&self) -> SrqAttr {
        self.attr
    }

    /// WQEs posted and not yet taken by a QP.
    #[must_use]
    pub fn len(&self) -> usize {
        self.wqes.len()
    }

    /// Whether no WQE is queued.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }

    /// Queues `wr`, unless the queue holds `max_wr` WQEs already (the caller checked its SGEs).
    pub(crate) fn push(&mut self, wr: RecvWr) -> Result<(), usize> {
        if self.wqes.len() >= self.attr.max_wr as usize {
            return Err(self.wqes.len());
        }
        self.wqes.push_back(wr);
        Ok(())
    }

    /// Takes the oldest WQE for a responder, and says whether that crossed the armed limit
    /// (rxe `get_srq_wqe`: fewer than `srq_limit` left), which disarms it.
    pub(crate) fn take(&mut self) -> Option<(RecvWr, bool)> {
        let wr = self.wqes.pop_front()?;
        let limit = self.attr.srq_limit;
        let reached = limit != 0 && self.wqes.len() < limit as usize;
        if reached {
            self.attr.srq_limit = 0;
        }
        Some((wr, reached))
    }

    /// Applies a checked modify.
    pub(crate) const fn set(&mut self, attr: &SrqAttr, mask: SrqAttrMask) {
        if mask.contains(SrqAttrMask::MAX_WR) {
            self.attr.max_wr = attr.max_wr;
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            self.attr.srq_limit = attr.srq_limit;
        }
    }
}

/// Why an SRQ attribute was refused (`EINVAL`, rxe `rxe_srq_chk_init` / `rxe_srq_chk_attr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SrqAttrError {
    /// `max_wr` is 0.
    #[error("an SRQ needs max_wr of at least 1")]
    ZeroWr,
    /// `max_wr` beyond the device's `max_srq_wr`.
    #[error("max_wr {0} exceeds the device's max_srq_wr {1}")]
    TooManyWr(u32, u32),
    /// `max_sge` beyond the device's `max_srq_sge`.
    #[error("max_sge {0} exceeds the device's max_srq_sge {1}")]
    TooManySge(u32, u32),
    /// A limit beyond the queue's size.
    #[error("srq_limit {0} exceeds the queue's max_wr {1}")]
    LimitTooLarge(u32, u32),
    /// A resize below the armed limit or below the WQEs queued now.
    #[error("max_wr {0} is below the armed limit or the {1} WQEs queued")]
    TooSmall(u32, u32),
    /// Mask bits other than `MAX_WR` and `LIMIT`.
    #[error("unknown SRQ attribute mask bits {0:#x}")]
    BadMask(u32),
}

/// Checks the attributes of a new SRQ against the device limits (rxe `rxe_srq_chk_init`).
pub(crate) const fn check_init(
    attr: &SrqAttr,
    max_srq_wr: u32,
    max_srq_sge: u32,
) -> Result<(), SrqAttrError> {
    if attr.max_wr == 0 {
        return Err(SrqAttrError::ZeroWr);
    }
    if attr.max_wr > max_srq_wr {
        return Err(SrqAttrError::TooManyWr(attr.max_wr, max_srq_wr));
    }
    if attr.max_sge > max_srq_sge {
        return Err(SrqAttrError::TooManySge(attr.max_sge, max_srq_sge));
    }
    if attr.srq_limit > attr.max_wr {
        return Err(SrqAttrError::LimitTooLarge(attr.srq_limit, attr.max_wr));
    }
    Ok(())
}

/// Checks a modify of `srq` (rxe `rxe_srq_chk_attr`; a resize must also keep the queued WQEs,
/// as `rxe_queue_resize` refuses to drop any).
pub(crate) fn check_modify(
    srq: &Srq,
    attr: &SrqAttr,
    mask: u32,
    max_srq_wr: u32,
) -> Result<SrqAttrMask, SrqAttrError> {
    let m = SrqAttrMask::from_bits(mask).ok_or(SrqAttrError::BadMask(mask))?;
    let mut max_wr = srq.attr.max_wr;
    if m.contains(SrqAttrMask::MAX_WR) {
        if attr.max_wr == 0 {
            return Err(SrqAttrError::ZeroWr);
        }
        if attr.max_wr > max_srq_wr {
            return Err(SrqAttrError::TooManyWr(attr.max_wr, max_srq_wr));
        }
        let queued = u32::try_from(srq.len()).unwrap_or(u32::MAX);
        if attr.max_wr < srq.attr.srq_limit || attr.max_wr < queued {
            return Err(SrqAttrError::TooSmall(attr.max_wr, queued));
        }
        max_wr = attr.max_wr;
    }
    if m.contains(SrqAttrMask::LIMIT) && attr.srq_limit > max_wr {
        return Err(SrqAttrError::LimitTooLarge(attr.srq_limit, max_wr));
    }
    Ok(m)
}

/// The SRQs of a device: a slot per [`SrqId`], reused after destruction (like the CQ table).
#[derive(Debug, Default)]
pub(crate) struct SrqTable {
    srqs: Vec<Option<Srq>>,
}

impl SrqTable {
    pub(crate) fn get(&self, id: SrqId) -> Option<&Srq> {
        self.srqs.get(id.0 as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: SrqId) -> Option<&mut Srq> {
        self.srqs.get_mut(id.0 as usize)?.as_mut()
    }

    /// SRQs that exist.
    pub(crate) fn live(&self) -> usize {
        self.srqs.iter().filter(|s| s.is_some()).count()
    }

    /// Whether any SRQ was made in `pd`.
    pub(crate) fn uses_pd(&self, pd: PdId) -> bool {
        self.srqs.iter().flatten().any(|s| s.pd == pd)
    }

    /// Puts `srq` in the lowest free slot.
    pub(crate) fn insert(&mut self, srq: Srq) -> SrqId {
        if let Some(i) = self.srqs.iter().position(Option::is_none) {
            self.srqs[i] = Some(srq);
            return SrqId(i as u32);
        }
        self.srqs.push(Some(srq));
        SrqId((self.srqs.len() - 1) as u32)
    }

    /// Empties `id`'s slot; trailing empty slots are dropped.
    pub(crate) fn remove(&mut self, id: SrqId) -> Option<Srq> {
        let out = self.srqs.get_mut(id.0 as usize)?.take();
        while self.srqs.last().is_some_and(Option::is_none) {
            self.srqs.pop();
        }
        out
    }

    /// Takes the oldest WQE of `id` for a responder ([`Srq::take`]).
    pub(crate) fn take(&mut self, id: SrqId) -> Option<(RecvWr, bool)> {
        self.get_mut(id)?.take()
    }
}

impl super::Device {
    /// Creates a shared receive queue in `pd` (`ibv_create_srq`). `attr.srq_limit` arms the
    /// limit at once, as rxe does. Call it before the QPs that receive through it
    /// ([`super::Device::create_qp_with_srq`]).
    ///
    /// # Errors
    /// [`DeviceError::NoSuchPd`], [`DeviceError::TooManySrqs`], or [`DeviceError::SrqAttr`]
    /// for a size of 0 or beyond `max_srq_wr` / `max_srq_sge` (rxe `rxe_srq_chk_init`:
    /// `EINVAL`).
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId, DeviceError> {
        if !self.pds.contains(&pd.0) {
            return Err(DeviceError::NoSuchPd(pd));
        }
        if self.srqs.live() >= self.config.max_srq {
            return Err(DeviceError::TooManySrqs(self.config.max_srq));
        }
        check_init(&attr, self.config.max_srq_wr, self.config.max_srq_sge)?;
        let attr = SrqAttr {
            max_sge: attr.max_sge.max(1),
            ..attr
        };
        Ok(self.srqs.insert(Srq::new(pd, attr)))
    }

    /// Changes an SRQ (`ibv_modify_srq`): [`SrqAttrMask::LIMIT`] arms the limit event with
    /// `attr.srq_limit` (0 disarms), [`SrqAttrMask::MAX_WR`] resizes the queue, keeping its
    /// WQEs. `mask` is the raw `ibv_srq_attr_mask`.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchSrq`], or [`DeviceError::SrqAttr`] (rxe `rxe_srq_chk_attr`:
    /// `EINVAL`) for unknown mask bits, a limit above the queue's size, or a size of 0,
    /// beyond `max_srq_wr`, below the armed limit or below the WQEs queued.
    pub fn modify_srq(&mut self, id: SrqId, attr: &SrqAttr, mask: u32) -> Result<(), DeviceError> {
        let max = self.config.max_srq_wr;
        let srq = self.srqs.get_mut(id).ok_or(DeviceError::NoSuchSrq(id))?;
        let mask = check_modify(srq, attr, mask, max)?;
        srq.set(attr, mask);
        Ok(())
    }

    /// An SRQ's attributes (`ibv_query_srq`).
    ///
    /// # Errors
    /// [`DeviceError::NoSuchSrq`].
    pub fn query_srq(&self, id: SrqId) -> Result<SrqAttr, DeviceError> {
        self.srqs
            .get(id)
            .map(Srq::attr)
            .ok_or(DeviceError::NoSuchSrq(id))
    }

    /// An SRQ, to inspect how many WQEs it holds.
    #[must_use]
    pub fn srq(&self, id: SrqId) -> Option<&Srq> {
        self.srqs.get(id)
    }

    /// Destroys an SRQ no QP uses (`ibv_destroy_srq`); its WQEs disappear without
    /// completions. Call it after destroying its QPs.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchSrq`], or [`DeviceError::SrqInUse`] while a QP receives through it
    /// (`EBUSY`).
    pub fn destroy_srq(&mut self, id: SrqId) -> Result<(), DeviceError> {
        if self.srqs.get(id).is_none() {
            return Err(DeviceError::NoSuchSrq(id));
        }
        if self.qps.values().any(|q| q.srq == Some(id)) {
            return Err(DeviceError::SrqInUse(id));
        }
        self.srqs.remove(id);
        Ok(())
    }

    /// Posts a receive WR to an SRQ (`ibv_post_srq_recv`); the QPs attached to it take them
    /// in order. Wakes nothing by itself: an RNR-NAKed peer retries on its own timer.
    ///
    /// # Errors
    /// [`PostError::NoSuchSrq`], [`PostError::TooManySge`] beyond the SRQ's `max_sge`
    /// (`EINVAL`), [`PostError::QueueFull`] when it holds `max_wr` WQEs (rxe: `ENOMEM`).
    pub fn post_srq_recv(&mut self, id: SrqId, wr: RecvWr) -> Result<(), PostError> {
        let srq = self.srqs.get_mut(id).ok_or(PostError::NoSuchSrq(id))?;
        let max_sge = srq.attr.max_sge as usize;
        if wr.sg_list.len() > max_sge {
            return Err(PostError::TooManySge(wr.sg_list.len(), max_sge));
        }
        srq.push(wr).map_err(PostError::QueueFull)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(id: u64) -> RecvWr {
        RecvWr {
            wr_id: id,
            sg_list: Vec::new(),
        }
    }

    #[test]
    fn limit_fires_once_below_the_armed_value_and_disarms() {
        let mut s = Srq::new(
            PdId(1),
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 2,
            },
        );
        for i in 0..4 {
            s.push(wr(i)).unwrap();
        }
        assert_eq!(s.push(wr(9)), Err(4), "full at max_wr");
        assert_eq!(s.take().map(|(w, r)| (w.wr_id, r)), Some((0, false)));
        assert_eq!(s.take().map(|(w, r)| (w.wr_id, r)), Some((1, false)));
        assert_eq!(s.take().map(|(w, r)| (w.wr_id, r)), Some((2, true)));
        assert_eq!(s.attr().srq_limit, 0, "disarmed");
        assert_eq!(s.take().map(|(w, r)| (w.wr_id, r)), Some((3, false)));
        assert!(s.take().is_none());
    }

    #[test]
    fn modify_checks_follow_rxe() {
        let mut s = Srq::new(
            PdId(1),
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        );
        s.push(wr(1)).unwrap();
        s.push(wr(2)).unwrap();
        let a = |max_wr, srq_limit| SrqAttr {
            max_wr,
            max_sge: 1,
            srq_limit,
        };
        let lim = SrqAttrMask::LIMIT.bits();
        let wr_ = SrqAttrMask::MAX_WR.bits();
        assert_eq!(check_modify(&s, &a(0, 3), lim, 16), Ok(SrqAttrMask::LIMIT));
        assert_eq!(
            check_modify(&s, &a(0, 5), lim, 16),
            Err(SrqAttrError::LimitTooLarge(5, 4))
        );
        assert_eq!(
            check_modify(&s, &a(1, 0), wr_, 16),
            Err(SrqAttrError::TooSmall(1, 2))
        );
        assert_eq!(
            check_modify(&s, &a(17, 0), wr_, 16),
            Err(SrqAttrError::TooManyWr(17, 16))
        );
        assert_eq!(
            check_modify(&s, &a(0, 0), wr_, 16),
            Err(SrqAttrError::ZeroWr)
        );
        assert_eq!(
            check_modify(&s, &a(8, 6), wr_ | lim, 16).map(|m| m.bits()),
            Ok(3)
        );
        assert_eq!(
            check_modify(&s, &a(0, 0), 4, 16),
            Err(SrqAttrError::BadMask(4))
        );
        s.set(&a(8, 6), SrqAttrMask::all());
        assert_eq!(s.attr(), a(8, 6));
        assert_eq!(check_init(&a(0, 0), 16, 4), Err(SrqAttrError::ZeroWr));
        assert_eq!(
            check_init(
                &SrqAttr {
                    max_sge: 5,
                    ..a(1, 0)
                },
                16,
                4
            ),
            Err(SrqAttrError::TooManySge(5, 4))
        );
    }
}
