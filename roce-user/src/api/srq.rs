//! Shared receive queues in the API: the id-based calls of [`Device`] (`create_srq`,
//! `modify_srq`, `query_srq`, `destroy_srq`, `post_srq_recv`) and the [`Srq`] handle.
//! The transport's rules are in `transport/srq.rs`: QPs created with an SRQ
//! ([`Device::create_qp_with_srq`], [`Pd::create_qp_with_srq`]) take its WQEs in the order
//! messages arrive, an empty SRQ answers with RNR NAKs, and an armed limit raises
//! [`Event::SrqLimitReached`](super::Event::SrqLimitReached) once, through
//! [`Device::wait_event`].

use super::{ApiError, Device, Pd, PdId, RecvWr, SrqAttr, SrqAttrMask, SrqId, transport};

impl Device {
    /// An SRQ's queue and its number in that queue's transport (see `Device::split_pd`).
    pub(super) fn split_srq(&self, srq: SrqId) -> (u32, SrqId) {
        let n = self.shards.len() as u32;
        (srq.0 % n, SrqId(srq.0 / n))
    }

    /// Creates a shared receive queue in `pd` (`ibv_create_srq`), on the PD's queue. A
    /// non-zero `attr.srq_limit` arms the limit event at once (as rxe does). Read the actual
    /// attributes back with [`Device::query_srq`].
    ///
    /// # Errors
    /// No such PD, too many SRQs (`ENOMEM`), or sizes of 0 or beyond the device's
    /// `max_srq_wr` / `max_srq_sge` (`EINVAL`).
    pub fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<SrqId, ApiError> {
        let (queue, raw) = self.split_pd(pd);
        let id = self.shards[queue as usize].lock().create_srq(raw, attr)?;
        Ok(SrqId(id.0 * self.shards() + queue))
    }

    /// Arms the limit (`mask` [`SrqAttrMask::LIMIT`], `attr.srq_limit`; 0 disarms) or resizes
    /// the SRQ ([`SrqAttrMask::MAX_WR`]), `ibv_modify_srq`.
    ///
    /// # Errors
    /// No such SRQ, or a value rxe refuses (`EINVAL`): a limit above the size, a size of 0,
    /// beyond `max_srq_wr`, below the armed limit or below the WQEs queued.
    pub fn modify_srq(
        &self,
        srq: SrqId,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), ApiError> {
        let (queue, raw) = self.split_srq(srq);
        self.shard(queue)?
            .lock()
            .modify_srq(raw, attr, mask.bits())?;
        Ok(())
    }

    /// The SRQ's attributes (`ibv_query_srq`); `srq_limit` reads 0 once the limit fired.
    ///
    /// # Errors
    /// No such SRQ.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, ApiError> {
        let (queue, raw) = self.split_srq(srq);
        Ok(self.shard(queue)?.lock().query_srq(raw)?)
    }

    /// WQEs posted to the SRQ and not yet taken by a QP, or `None` for no such SRQ.
    #[must_use]
    pub fn srq_len(&self, srq: SrqId) -> Option<usize> {
        let (queue, raw) = self.split_srq(srq);
        Some(self.shard(queue).ok()?.lock().srq(raw)?.len())
    }

    /// Destroys an SRQ (`ibv_destroy_srq`); its WQEs go without completions. Call it after
    /// destroying the QPs that receive through it; [`Srq`] does it when dropped.
    ///
    /// # Errors
    /// `EBUSY` while a QP receives through it, or no such SRQ.
    pub fn destroy_srq(&self, srq: SrqId) -> Result<(), ApiError> {
        let (queue, raw) = self.split_srq(srq);
        match self.shard(queue)?.lock().destroy_srq(raw) {
            Err(transport::DeviceError::NoSuchSrq(_)) => {
                Err(transport::DeviceError::NoSuchSrq(srq).into())
            }
            Err(transport::DeviceError::SrqInUse(_)) => {
                Err(transport::DeviceError::SrqInUse(srq).into())
            }
            r => Ok(r?),
        }
    }

    /// Posts a receive WR to the SRQ (`ibv_post_srq_recv`); any QP attached to it may take it.
    ///
    /// # Errors
    /// No such SRQ, more SGEs than its `max_sge` (`EINVAL`), or full (`ENOMEM`).
    pub fn post_srq_recv(&self, srq: SrqId, wr: RecvWr) -> Result<(), ApiError> {
        let (queue, raw) = self.split_srq(srq);
        let sh = self.shard(queue)?;
        sh.lock().post_srq_recv(raw, wr)?;
        self.drive_or_kick(sh);
        Ok(())
    }
}

impl<'d> Pd<'d> {
    /// Creates a shared receive queue in this PD as a handle that destroys it when dropped
    /// (`ibv_create_srq`; the id form is [`Device::create_srq`]). Call it before the QPs that
    /// receive through it ([`Pd::create_qp_with_srq`]), which borrow it.
    ///
    /// # Errors
    /// As [`Device::create_srq`].
    pub fn create_srq(&self, attr: SrqAttr) -> Result<Srq<'_>, ApiError> {
        Ok(Srq {
            dev: self.device(),
            _pd: self,
            id: self.device().create_srq(self.id(), attr)?,
        })
    }
}

/// A shared receive queue (`struct ibv_srq`), made by [`Pd::create_srq`]; dropping it destroys
/// it. The QPs that receive through it borrow it, so they are gone before it is.
#[derive(Debug)]
pub struct Srq<'p> {
    dev: &'p Device,
    _pd: &'p Pd<'p>,
    id: SrqId,
}

impl Srq<'_> {
    /// The SRQ's id, for the id-based calls of [`Device`] and to match
    /// [`Event::SrqLimitReached`](super::Event::SrqLimitReached).
    #[must_use]
    pub const fn id(&self) -> SrqId {
        self.id
    }

    /// Posts a receive WR ([`Device::post_srq_recv`]).
    ///
    /// # Errors
    /// As [`Device::post_srq_recv`].
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), ApiError> {
        self.dev.post_srq_recv(self.id, wr)
    }

    /// Arms the limit event at `limit` WQEs (0 disarms), [`Device::modify_srq`].
    ///
    /// # Errors
    /// As [`Device::modify_srq`].
    pub fn arm_limit(&self, limit: u32) -> Result<(), ApiError> {
        let attr = SrqAttr {
            srq_limit: limit,
            ..SrqAttr::default()
        };
        self.dev.modify_srq(self.id, &attr, SrqAttrMask::LIMIT)
    }

    /// Changes the SRQ ([`Device::modify_srq`]).
    ///
    /// # Errors
    /// As [`Device::modify_srq`].
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), ApiError> {
        self.dev.modify_srq(self.id, attr, mask)
    }

    /// Its attributes ([`Device::query_srq`]).
    ///
    /// # Errors
    /// As [`Device::query_srq`].
    pub fn query(&self) -> Result<SrqAttr, ApiError> {
        self.dev.query_srq(self.id)
    }

    /// WQEs queued and not yet taken.
    #[must_use]
    pub fn len(&self) -> usize {
        self.dev.srq_len(self.id).unwrap_or(0)
    }

    /// Whether no WQE is queued.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Destroys the SRQ now, reporting the error that drop would only log.
    ///
    /// # Errors
    /// `EBUSY` if a QP made through the id-based calls still uses it.
    pub fn destroy(self) -> Result<(), ApiError> {
        let r = self.dev.destroy_srq(self.id);
        std::mem::forget(self);
        r
    }
}

impl Drop for Srq<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.dev.destroy_srq(self.id) {
            log::warn!("releasing a shared receive queue on drop failed: {e}");
        }
    }
}
