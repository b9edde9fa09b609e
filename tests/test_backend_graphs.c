/* Graphs (core/backend.h, luna_backend_memory graph_begin ... graph_free) on the backend under
 * test (LUNA_TEST_BACKEND): captured ops run only when the graph is launched, every launch reads
 * the memory as it is then (inputs changed between launches give the new results), nothing runs
 * at capture, and host transfers and allocations are refused while capturing (a graph replays
 * device work only), after which the backend works as before. A backend without graphs (the CPU)
 * says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "tests/backend_harness.h"

enum { N = 37 };

START_TEST(captured_ops_run_at_each_launch) {
    luna_backend *be = lh_backend(2);
    if (!luna_graphs_available(be)) {
        ck_assert_int_eq(luna_graph_begin(be), LUNA_ERR_UNSUPPORTED);
        printf("graphs: the %s backend has none\n", be->name);
        luna_backend_free(be);
        return;
    }
    float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)i;
    float *dx = lh_f32(be, x, N), *dy = lh_f32(be, x, N); /* y starts as x */
    luna_device_stats before, after;
    be->mem->device_stats(be, &before);
    LUNA_CHECK_OK(luna_graph_begin(be));
    LUNA_CHECK_OK(be->ops->add(be, dy, dx, dx, N));     /* y = 2x */
    LUNA_CHECK_OK(be->ops->scale_act(be, dy, 0.5f, N)); /* y = x */
    LUNA_CHECK_OK(be->ops->add(be, dy, dy, dx, N));     /* y = 2x */
    void *graph = NULL;
    LUNA_CHECK_OK(luna_graph_end(be, &graph));
    ck_assert_ptr_nonnull(graph);
    /* nothing ran: y is still x (the element 3 would be 6 after the ops) */
    LUNA_CHECK_OK(luna_mem_to_host(be, y, dy, sizeof y));
    ck_assert_float_eq(y[3], 3.0f);
    for (int round = 1; round <= 3; round++) {
        for (int i = 0; i < N; i++)
            x[i] = (float)(round * 100 + i);
        LUNA_CHECK_OK(luna_mem_from_host(be, dx, x, sizeof x));
        LUNA_CHECK_OK(luna_graph_launch(be, graph));
        LUNA_CHECK_OK(luna_mem_to_host(be, y, dy, sizeof y));
        for (int i = 0; i < N; i++)
            ck_assert_msg(y[i] == 2.0f * x[i], "launch %d: y[%d] = %g, want %g", round, i,
                          (double)y[i], 2.0 * x[i]);
    }
    be->mem->device_stats(be, &after);
    ck_assert_uint_eq(after.graphs - before.graphs, 3);
    luna_graph_free(be, graph);
    lh_free(be, dx), lh_free(be, dy);
    luna_backend_free(be);
}
END_TEST

START_TEST(host_work_is_refused_while_capturing) {
    luna_backend *be = lh_backend(1);
    if (!luna_graphs_available(be)) {
        printf("graphs: the %s backend has none\n", be->name);
        luna_backend_free(be);
        return;
    }
    float x[N] = {0}, *dx = lh_f32(be, x, N);
    LUNA_CHECK_OK(luna_graph_begin(be));
    ck_assert_int_eq(luna_graph_begin(be), LUNA_ERR_INVALID_ARGUMENT); /* one at a time */
    ck_assert_int_eq(luna_mem_from_host(be, dx, x, sizeof x), LUNA_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "while capturing a graph"));
    ck_assert_int_eq(luna_mem_to_host(be, x, dx, sizeof x), LUNA_ERR_UNSUPPORTED);
    ck_assert_int_eq(be->mem->synchronize(be), LUNA_ERR_UNSUPPORTED);
    ck_assert_ptr_null(luna_mem_alloc(be, 1024));
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "an allocation while capturing"));
    void *graph = NULL;
    LUNA_CHECK_OK(luna_graph_end(be, &graph));
    luna_graph_free(be, graph);
    ck_assert_int_eq(luna_graph_end(be, &graph), LUNA_ERR_INVALID_ARGUMENT); /* none running */
    ck_assert_ptr_null(graph);
    /* afterwards the backend transfers and allocates again */
    x[5] = 7.0f;
    LUNA_CHECK_OK(luna_mem_from_host(be, dx, x, sizeof x));
    float back[N];
    LUNA_CHECK_OK(luna_mem_to_host(be, back, dx, sizeof back));
    ck_assert_float_eq(back[5], 7.0f);
    void *p = luna_mem_alloc(be, 1024);
    ck_assert_ptr_nonnull(p);
    luna_mem_release(be, p, 1024);
    lh_free(be, dx);
    luna_backend_free(be);
}
END_TEST

static Suite *graphs_suite(void) {
    Suite *s = suite_create("backend_graphs");
    TCase *tc = tcase_create("graphs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, captured_ops_run_at_each_launch);
    tcase_add_test(tc, host_work_is_refused_while_capturing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(graphs_suite()); }
