//! Random demand on a leasing fleet, for the property tests of the leased modes.

/// One step of a leasing fleet's random demand.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// Instance `i` asks for `n` units.
    Check(usize, u64),
    /// Time passes, in milliseconds.
    Sleep(u64),
}

/// Random demand from up to four instances: mostly checks of 1 to 3 units, now and then a
/// pause of up to 20 ms.
pub(crate) fn demand() -> impl proptest::strategy::Strategy<Value = Vec<Op>> {
    use proptest::prelude::*;
    prop::collection::vec(
        prop_oneof![
            8 => (0usize..4, 1u64..=3).prop_map(|(i, n)| Op::Check(i, n)),
            1 => (0u64..=20).prop_map(Op::Sleep),
        ],
        1..150,
    )
}
