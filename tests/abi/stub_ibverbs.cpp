// A stand-in for libibverbs v34/v35 in tests/abi: it defines the symbol versions those
// releases export (IBVERBS_1.0 ... IBVERBS_1.13, IBVERBS_PRIVATE_34) but not IBVERBS_1.14,
// which arrived in v36 together with the ops-table slot that changed the layout. Only the
// version definitions matter to the loader's check; the functions are never called.
extern "C" {
[[gnu::visibility("default")]] void uroce_stub_ibverbs_1_0() {}
[[gnu::visibility("default")]] void uroce_stub_ibverbs_private_34() {}
}
