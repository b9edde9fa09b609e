/* Tests of the learning-rate schedules (optim/lr_scheduler.c) against the formulas of apollo.md
 * and fairseq, written out independently here, and of the milestone parser. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optim/lr_scheduler.h"
#include "tests/test_util.h"

static void expect_lr(const luna_lr_scheduler_config *c, int64_t k, double want) {
    double got = luna_lr_at(c, k);
    ck_assert_msg(fabs(got - want) <= 1e-12 * fabs(want) + 1e-300, "lr at %lld: %.17g, want %.17g",
                  (long long)k, got, want);
}

START_TEST(test_milestone_wmt) {
    luna_lr_scheduler_config c;
    luna_lr_scheduler_defaults(&c, LUNA_LR_MILESTONE);
    ck_assert_int_eq(luna_lr_scheduler_check(&c), LUNA_OK);
    /* WMT: init 1e-5, lr_max 0.1, warmup 1000, milestones 300000 450000, decay 0.1. */
    const double l0 = 1e-5, L = 0.1;
    expect_lr(&c, 0, l0);
    expect_lr(&c, 1, l0 + 1 * (L - l0) / 1000);
    expect_lr(&c, 500, l0 + 500 * (L - l0) / 1000);
    expect_lr(&c, 1000, L);
    expect_lr(&c, 1001, L);
    expect_lr(&c, 299999, L);
    expect_lr(&c, 300000, L * 0.1);
    expect_lr(&c, 300001, L * 0.1);
    expect_lr(&c, 449999, L * 0.1);
    expect_lr(&c, 450000, L * 0.1 * 0.1);
    expect_lr(&c, 10000000, L * 0.1 * 0.1);
    /* The recursive definition of apollo.md, run update by update, gives the same values. */
    double lr = l0;
    for (int64_t k = 1; k <= 460000; k++) {
        if (k <= 1000)
            lr = l0 + (double)k * (L - l0) / 1000;
        else if (k == 300000 || k == 450000)
            lr *= 0.1;
        if (k % 997 == 0 || k <= 1002 || (k >= 299998 && k <= 300002) || k == 450000)
            ck_assert_msg(fabs(luna_lr_at(&c, k) - lr) <= 1e-12 * lr, "k=%lld", (long long)k);
    }
}
END_TEST

START_TEST(test_inverse_sqrt) {
    luna_lr_scheduler_config c;
    luna_lr_scheduler_defaults(&c, LUNA_LR_INVERSE_SQRT);
    c.lr = 7e-4;
    c.warmup_updates = 4000;
    c.warmup_init_lr = 1e-7;
    const double step = (7e-4 - 1e-7) / 4000;
    expect_lr(&c, 0, 1e-7);
    expect_lr(&c, 1, 1e-7 + step);
    expect_lr(&c, 3999, 1e-7 + 3999 * step);
    expect_lr(&c, 4000, 7e-4);
    expect_lr(&c, 16000, 7e-4 * 0.5);
    expect_lr(&c, 100000, 7e-4 * sqrt(4000.0 / 100000.0));
    c.warmup_init_lr = -1; /* fairseq default: 0 with warmup */
    expect_lr(&c, 0, 0.0);
    expect_lr(&c, 2000, 3.5e-4);
    c.warmup_updates = 0;
    expect_lr(&c, 0, 7e-4);
    expect_lr(&c, 4, 3.5e-4);
}
END_TEST

START_TEST(test_fixed) {
    luna_lr_scheduler_config c;
    luna_lr_scheduler_defaults(&c, LUNA_LR_FIXED);
    c.lr = 0.25;
    expect_lr(&c, 0, 0.25);
    expect_lr(&c, 12345, 0.25);
    c.warmup_updates = 4; /* fairseq: lr·(k+1)/W during warmup */
    expect_lr(&c, 0, 0.0625);
    expect_lr(&c, 3, 0.25);
    expect_lr(&c, 4, 0.25);
}
END_TEST

START_TEST(test_milestone_edges) {
    luna_lr_scheduler_config c;
    luna_lr_scheduler_defaults(&c, LUNA_LR_MILESTONE);
    c.num_milestones = 0;
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "5,20"), LUNA_OK);
    c.warmup_updates = 10;
    c.warmup_init_lr = 0.0;
    c.lr = 1.0;
    c.decay_rate = 0.5;
    expect_lr(&c, 5, 0.5); /* a milestone inside the warmup has no effect */
    expect_lr(&c, 10, 1.0);
    expect_lr(&c, 19, 1.0);
    expect_lr(&c, 20, 0.5);
    c.warmup_updates = 0; /* no warmup: lr_max from the start */
    expect_lr(&c, 0, 1.0);
    expect_lr(&c, 5, 0.5);
    expect_lr(&c, 25, 0.25);
}
END_TEST

START_TEST(test_parse_milestones) {
    luna_lr_scheduler_config c;
    luna_lr_scheduler_defaults(&c, LUNA_LR_MILESTONE);
    c.num_milestones = 0;
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "300000 450000"), LUNA_OK);
    ck_assert_int_eq(c.num_milestones, 2);
    ck_assert(c.milestones[0] == 300000 && c.milestones[1] == 450000);
    c.num_milestones = 0;
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "[100, 200,300]"), LUNA_OK);
    ck_assert_int_eq(c.num_milestones, 3);
    ck_assert(c.milestones[2] == 300);
    /* argv style: one word at a time */
    c.num_milestones = 0;
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "300000"), LUNA_OK);
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "450000"), LUNA_OK);
    ck_assert_int_eq(c.num_milestones, 2);
    /* errors leave the config unchanged */
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "500000 400000"), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "12x"), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "-5"), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(luna_lr_parse_milestones(&c, "100"), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(c.num_milestones, 2);
    c.num_milestones = 0;
    char many[256] = "";
    for (int i = 1; i <= 17; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%d ", i);
    ck_assert_int_eq(luna_lr_parse_milestones(&c, many), LUNA_ERR_INVALID_ARGUMENT);
    luna_lr_scheduler_kind k;
    ck_assert_int_eq(luna_lr_scheduler_kind_parse("inverse_sqrt", &k), LUNA_OK);
    ck_assert(k == LUNA_LR_INVERSE_SQRT);
    ck_assert_int_eq(luna_lr_scheduler_kind_parse("cosine", &k), LUNA_ERR_INVALID_ARGUMENT);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("optim_schedule");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_milestone_wmt);
    tcase_add_test(tc, test_inverse_sqrt);
    tcase_add_test(tc, test_fixed);
    tcase_add_test(tc, test_milestone_edges);
    tcase_add_test(tc, test_parse_milestones);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
