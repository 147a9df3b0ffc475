/* DDAK per-pool loop (moment/placement/ddak.py documents the algorithm; ddak_reference is the spec).
 *
 * Built by the package build (setup.py) as moment.placement._ddak, with MOMENT_DDAK_MODULE defined so
 * the file is also an (empty) importable extension module; the kernel itself is called through ctypes.
 * A source checkout without a build compiles it on first use instead (moment/placement/_native.py):
 *   cc -O2 -shared -fPIC -ffp-contract=off ddak.c -o ddak.so
 * -ffp-contract=off keeps every floating-point operation identical to the Python reference
 * (no fused multiply-add), so both produce bit-identical placements.
 */
#include <math.h>
#include <stdint.h>

/* S: prefix sums of hotness in descending-hotness order, S[0] = 0, length n + 1.
 * Bins are filled tier by tier; within a tier the open bin with the lowest priority
 * (access / traffic) * (used / cap) takes the next pool (ties: lowest bin index).
 * Output: runs of consecutive ranks placed in one bin (seg_bin, seg_len), merged when adjacent.
 * Returns the number of runs, or -1 if max_seg is too small; *pos_out = ranks placed
 * (< n when every bin is closed). */
int64_t ddak_fill(const double *S, int64_t n, int64_t pool, int32_t nb,
                  const double *traffic, const int64_t *cap, const int32_t *tier,
                  const uint8_t *closes, double *access, int64_t *used,
                  int32_t *seg_bin, int64_t *seg_len, int64_t max_seg, int64_t *pos_out)
{
    int64_t p = 0, ns = 0;
    int32_t max_tier = 0;
    for (int32_t b = 0; b < nb; b++)
        if (tier[b] > max_tier) max_tier = tier[b];
    for (int32_t t = 0; t <= max_tier && p < n; t++) {
        while (p < n) {
            int32_t best = -1;
            double bp = 0.0;
            for (int32_t b = 0; b < nb; b++) {
                if (tier[b] != t || used[b] >= cap[b]) continue;
                if (closes[b] && access[b] >= traffic[b]) continue;
                double pr = traffic[b] > 0.0
                    ? (access[b] / traffic[b]) * ((double)used[b] / (double)cap[b])
                    : INFINITY;
                if (best < 0 || pr < bp) { best = b; bp = pr; }
            }
            if (best < 0) break;
            int64_t k = pool;
            if (cap[best] - used[best] < k) k = cap[best] - used[best];
            if (n - p < k) k = n - p;
            access[best] += S[p + k] - S[p];
            used[best] += k;
            p += k;
            if (ns > 0 && seg_bin[ns - 1] == best) {
                seg_len[ns - 1] += k;
            } else {
                if (ns >= max_seg) { *pos_out = p; return -1; }
                seg_bin[ns] = best;
                seg_len[ns] = k;
                ns++;
            }
        }
    }
    *pos_out = p;
    return ns;
}

#ifdef MOMENT_DDAK_MODULE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* An empty module: importing it only proves the build; moment/placement/_native.py loads this same
 * file with ctypes and calls ddak_fill. */
static struct PyModuleDef ddak_module = {
    PyModuleDef_HEAD_INIT, "_ddak", "DDAK kernel (ddak_fill), loaded through ctypes", -1, NULL,
};

PyMODINIT_FUNC PyInit__ddak(void) { return PyModule_Create(&ddak_module); }
#endif
