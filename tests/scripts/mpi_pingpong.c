// Two-rank MPI ping-pong that checks every byte (tests/scripts/test_ucx.sh runs it over
// Open MPI's pml ucx on uroce devices).
//
//   mpi_pingpong [ROUNDS]   (default 10, at most 1000)
//
// For each message size and round, rank 0 sends a buffer whose bytes depend on the size, the
// round and their position; rank 1 checks the length and every byte, and answers with the
// bytes transformed (another pattern), which rank 0 checks the same way. Any mismatch is
// reported with its offset and ends the job with exit status 3 (MPI_Abort). On success rank 0
// prints "mpi_pingpong ok: N messages, B bytes checked".
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// From one byte to beyond UCX's eager limits, so that both short/eager and the rendezvous
// protocols run.
static const int kSizes[] = {1, 7, 64, 1000, 4096, 9000, 65536, 262144};
#define NUM_SIZES ((int)(sizeof(kSizes) / sizeof(kSizes[0])))

static unsigned char pattern(int dir, int size, int round, size_t i) {
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(size * 40503) ^ (uint32_t)(round * 97);
    x ^= x >> 13;
    return (unsigned char)(x + (uint32_t)dir * 0x5b);
}

static void fill(unsigned char* buf, int dir, int size, int round) {
    for (size_t i = 0; i < (size_t)size; ++i) buf[i] = pattern(dir, size, round, i);
}

// Checks the length and every byte of a received message; the first mismatch aborts the job.
static void check(const unsigned char* buf, const MPI_Status* st, int dir, int size, int round,
                  int rank) {
    int count = -1;
    MPI_Get_count(st, MPI_BYTE, &count);
    if (count != size) {
        fprintf(stderr, "mpi_pingpong: rank %d: size %d round %d: received %d bytes\n", rank, size,
                round, count);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (size_t i = 0; i < (size_t)size; ++i) {
        unsigned char want = pattern(dir, size, round, i);
        if (buf[i] != want) {
            fprintf(stderr,
                    "mpi_pingpong: rank %d: size %d round %d: byte %zu is 0x%02x, want 0x%02x\n",
                    rank, size, round, i, buf[i], want);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, nranks = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2) {
        if (rank == 0) fprintf(stderr, "mpi_pingpong: needs exactly 2 ranks, got %d\n", nranks);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    if (rounds < 1 || rounds > 1000) {
        if (rank == 0) fprintf(stderr, "mpi_pingpong: ROUNDS must be 1..1000\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int max = kSizes[NUM_SIZES - 1];
    unsigned char* out = malloc((size_t)max);
    unsigned char* in = malloc((size_t)max);
    if (!out || !in) MPI_Abort(MPI_COMM_WORLD, 2);

    long messages = 0;
    long long bytes = 0;
    for (int s = 0; s < NUM_SIZES; ++s) {
        int size = kSizes[s];
        for (int r = 0; r < rounds; ++r) {
            MPI_Status st;
            // A stale byte from the previous message must not pass for a received one.
            memset(in, 0xee, (size_t)size);
            if (rank == 0) {
                fill(out, 0, size, r);
                MPI_Send(out, size, MPI_BYTE, 1, s, MPI_COMM_WORLD);
                MPI_Recv(in, max, MPI_BYTE, 1, s, MPI_COMM_WORLD, &st);
                check(in, &st, 1, size, r, rank);
            } else {
                MPI_Recv(in, max, MPI_BYTE, 0, s, MPI_COMM_WORLD, &st);
                check(in, &st, 0, size, r, rank);
                fill(out, 1, size, r);
                MPI_Send(out, size, MPI_BYTE, 0, s, MPI_COMM_WORLD);
            }
            messages += 2;
            bytes += 2LL * size;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("mpi_pingpong ok: %ld messages, %lld bytes checked\n", messages, bytes);
    free(out);
    free(in);
    MPI_Finalize();
    return 0;
}
