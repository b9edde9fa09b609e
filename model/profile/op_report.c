/* op_report.h: the per-family table and the roofline predictions. */
#include "model/profile/op_report.h"

#include <math.h>
#include <string.h>

#include "model/profile/gpu_roofline.h"

#define BF16_BYTES 2.0
#define MAX_FAMILIES 64

/* Predicted seconds of the counted work of one op on `g`, and which bound decides it. */
static double op_time(const luna_op_counter *c, const luna_gpu_spec *g, const char **bound) {
    double compute = c->mm_flops / g->mm_flops_per_s + c->flops / g->fp32_flops_per_s;
    double memory = (c->act_elems * BF16_BYTES + c->bytes) / g->bytes_per_s;
    double launch = c->calls * g->launch_s;
    if (bound)
        *bound = launch > fmax(compute, memory) ? "launch"
                 : compute > memory             ? "compute"
                                                : "memory";
    return fmax(compute, memory) + launch;
}

typedef struct {
    const char *family;
    luna_op_counter sum;
    double t100, t200;
} family_row;

/* The family's calibration row (gpu_roofline.h), or NULL. */
static const luna_gpu_calibration *calibration_of(const char *family) {
    for (const luna_gpu_calibration *c = luna_gpu_calibration_h200; c->family; c++)
        if (strcmp(c->family, family) == 0) return c;
    return NULL;
}

double luna_op_report_calibrated_h200(const char *family, double predicted_h200) {
    const luna_gpu_calibration *c = calibration_of(family);
    return c ? c->ratio * predicted_h200 : predicted_h200;
}

void luna_op_report_print(FILE *f, const luna_op_counter *c, bool measured, int measured_act_bytes,
                          double tokens, const char *unit) {
    family_row rows[MAX_FAMILIES];
    int nrows = 0;
    luna_op_counter total = {0};
    double t100 = 0, t200 = 0;
    for (int i = 0; i < LUNA_OP_COUNT; i++) {
        if (c[i].calls == 0) continue;
        const char *fam = luna_op_family(i);
        int r = 0;
        while (r < nrows && strcmp(rows[r].family, fam) != 0)
            r++;
        if (r == nrows) {
            if (nrows == MAX_FAMILIES) continue; /* cannot happen: families are fewer than ops */
            rows[nrows++] = (family_row){.family = fam};
        }
        double a = op_time(&c[i], &luna_gpu_h100_sxm, NULL),
               b = op_time(&c[i], &luna_gpu_h200_sxm, NULL);
        rows[r].t100 += a, rows[r].t200 += b, t100 += a, t200 += b;
        luna_op_counter *s = &rows[r].sum;
        s->calls += c[i].calls, s->mm_flops += c[i].mm_flops, s->flops += c[i].flops;
        s->act_elems += c[i].act_elems, s->bytes += c[i].bytes, s->seconds += c[i].seconds;
        total.calls += c[i].calls, total.mm_flops += c[i].mm_flops, total.flops += c[i].flops;
        total.act_elems += c[i].act_elems, total.bytes += c[i].bytes;
        total.seconds += c[i].seconds;
    }
    fprintf(f, "%-19s %8s %10s %10s %9s %8s %6s | %18s %18s %16s\n", "op family", "calls",
            "GFLOP(mm)", "GFLOP(oth)", "GB", measured ? "meas. s" : "meas.", "share",
            "PREDICTED H100 ms", "PREDICTED H200 ms", "calibrated H200");
    double tcal = 0;
    for (int r = 0; r < nrows; r++) {
        const luna_op_counter *s = &rows[r].sum;
        double gb = (s->act_elems * measured_act_bytes + s->bytes) * 1e-9;
        const luna_gpu_calibration *cal = calibration_of(rows[r].family);
        const double tc = luna_op_report_calibrated_h200(rows[r].family, rows[r].t200);
        tcal += tc;
        char calibrated[32];
        snprintf(calibrated, sizeof calibrated, "%.3f%s", tc * 1e3,
                 !cal           ? " (=)"
                 : cal->changed ? " *"
                                : "");
        if (measured)
            fprintf(f, "%-19s %8.0f %10.2f %10.2f %9.3f %8.3f %5.1f%% | %18.3f %18.3f %16s\n",
                    rows[r].family, s->calls, s->mm_flops * 1e-9, s->flops * 1e-9, gb, s->seconds,
                    total.seconds > 0 ? 100 * s->seconds / total.seconds : 0, rows[r].t100 * 1e3,
                    rows[r].t200 * 1e3, calibrated);
        else
            fprintf(f, "%-19s %8.0f %10.2f %10.2f %9.3f %8s %6s | %18.3f %18.3f %16s\n",
                    rows[r].family, s->calls, s->mm_flops * 1e-9, s->flops * 1e-9, gb, "-", "-",
                    rows[r].t100 * 1e3, rows[r].t200 * 1e3, calibrated);
    }
    double gb = (total.act_elems * measured_act_bytes + total.bytes) * 1e-9;
    char secs[32] = "-";
    if (measured) snprintf(secs, sizeof secs, "%.3f", total.seconds);
    fprintf(f, "%-19s %8.0f %10.2f %10.2f %9.3f %8s %6s | %18.3f %18.3f %16.3f\n", "total",
            total.calls, total.mm_flops * 1e-9, total.flops * 1e-9, gb, secs, "", t100 * 1e3,
            t200 * 1e3, tcal * 1e3);
    fprintf(f,
            "(GB at %d-byte activations as profiled; the PREDICTED columns use bf16 "
            "activations: %.3f GB)\n",
            measured_act_bytes, (total.act_elems * BF16_BYTES + total.bytes) * 1e-9);
    if (measured && total.seconds > 0)
        fprintf(f, "measured on this backend (ops only, synchronized one by one): %.1f %s/s\n",
                tokens / total.seconds, unit);
    const luna_gpu_spec *gpus[2] = {&luna_gpu_h100_sxm, &luna_gpu_h200_sxm};
    double times[2] = {t100, t200};
    for (int g = 0; g < 2; g++)
        fprintf(f,
                "PREDICTED %s (bf16, roofline at vendor peaks + %.0f us/launch): %.3f ms, "
                "%.0f %s/s, MFU %.1f%% (model FLOPs = counted GEMM+linear FLOPs %.1f GFLOP; "
                "%.0f%% of the time in launch overhead)\n",
                gpus[g]->name, gpus[g]->launch_s * 1e6, times[g] * 1e3, tokens / times[g], unit,
                100 * total.mm_flops / (times[g] * gpus[g]->mm_flops_per_s), total.mm_flops * 1e-9,
                100 * total.calls * gpus[g]->launch_s / times[g]);
    fprintf(f,
            "PREDICTED H200 SXM calibrated on %s (each family's roofline time times its measured/"
            "PREDICTED ratio there; * = kernels rewritten since, a stale ratio; (=) = no ratio): "
            "%.3f ms, %.0f %s/s, MFU %.1f%%\n",
            LUNA_GPU_CALIBRATED_ON, tcal * 1e3, tokens / tcal, unit,
            100 * total.mm_flops / (tcal * luna_gpu_h200_sxm.mm_flops_per_s));
    /* The five ops (forward and backward apart: they are separate kernels) that take longest. */
    int top[5], ntop = 0;
    for (int k = 0; k < 5; k++) {
        int best = -1;
        double bt = 0;
        for (int i = 0; i < LUNA_OP_COUNT; i++) {
            bool taken = false;
            for (int j = 0; j < ntop; j++)
                taken |= top[j] == i;
            double t = c[i].calls > 0 ? op_time(&c[i], &luna_gpu_h100_sxm, NULL) : 0;
            if (!taken && t > bt) best = i, bt = t;
        }
        if (best < 0) break;
        top[ntop++] = best;
    }
    fprintf(f, "PREDICTED H100 top %d ops:", ntop);
    for (int k = 0; k < ntop; k++) {
        const char *bound;
        double t = op_time(&c[top[k]], &luna_gpu_h100_sxm, &bound);
        fprintf(f, "%s %s %.3f ms (%.1f%%, %s-bound)", k ? "," : "", luna_op_name(top[k]), t * 1e3,
                100 * t / t100, bound);
    }
    fprintf(f, "\n");
}

void luna_op_counters_extrapolate(luna_op_counter *out, const luna_op_counter *c1, double x1,
                                  const luna_op_counter *c2, double x2, double x) {
    double w = (x - x1) / (x2 - x1);
    for (int i = 0; i < LUNA_OP_COUNT; i++) {
#define LERP(field) out[i].field = c1[i].field + w * (c2[i].field - c1[i].field)
        LERP(calls), LERP(mm_flops), LERP(flops), LERP(act_elems), LERP(bytes), LERP(seconds);
#undef LERP
    }
}

double luna_op_counters_max_rel_diff(const luna_op_counter *a, const luna_op_counter *b) {
    double worst = 0;
    for (int i = 0; i < LUNA_OP_COUNT; i++) {
        const double x[4] = {a[i].calls, a[i].mm_flops + a[i].flops, a[i].act_elems, a[i].bytes};
        const double y[4] = {b[i].calls, b[i].mm_flops + b[i].flops, b[i].act_elems, b[i].bytes};
        for (int k = 0; k < 4; k++)
            if (x[k] != y[k]) worst = fmax(worst, fabs(x[k] - y[k]) / fmax(fabs(x[k]), fabs(y[k])));
    }
    return worst;
}
