// SPDX-License-Identifier: Apache-2.0
// cuda_tensor_test.c - CUDA storage for tensors. Without a device (or a
// build without CUDA) the device cases skip with the reason, and the cases
// that need no device check the refusals and messages.

#include <tpipe/tensor.h>

#include "core/cuda.h"
#include "tp_test.h"

static const tp_device cpu = {TP_DEVICE_CPU, 0};
static const tp_device gpu0 = {TP_DEVICE_CUDA, 0};

static void
need_cuda(void)
{
    char why[256];
    if (!tp__cuda_available(why, sizeof(why))) {
        tp_test_skip("no CUDA device here: %s", why);
    }
}

// Without a device, creating CUDA storage fails with TP_ENOTSUP and says
// why; nothing crashes.
static void
unavailable_is_explained(void)
{
    char why[256] = "";
    if (tp__cuda_available(why, sizeof(why))) {
        tp_test_skip("a CUDA device is present: this case is for machines "
                     "without one");
    }
    TP_CHECK(strlen(why) > 0);
    int64_t shape[1] = {4};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_tensor_empty_on(gpu0, TP_F32, 1, shape, &t, &err),
                TP_ENOTSUP);
    TP_CHECK(t == NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), why);
    tp_error_unref(err);
    err = NULL;
    tp_tensor *h;
    TP_CHECK_OK(tp_tensor_arange(TP_F32, 0, 4, 1, &h, &err), err);
    TP_CHECK_EQ(tp_tensor_to_device(h, gpu0, &t, &err), TP_ENOTSUP);
    tp_error_unref(err);
    tp_tensor_unref(h);
}

// Moving to the device a tensor is already on returns it.
static void
same_device_is_a_reference(void)
{
    int64_t shape[2] = {2, 3};
    tp_tensor *h, *o;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 2, shape, &h, &err), err);
    TP_CHECK_OK(tp_tensor_to_device(h, cpu, &o, &err), err);
    TP_CHECK(o == h);
    tp_tensor_unref(o);
    tp_tensor_unref(h);
    int64_t bad_shape[1] = {-1};
    tp_device bogus = {(tp_device_type)7, 0};
    TP_CHECK_EQ(tp_tensor_empty_on(bogus, TP_F32, 1, shape, &h, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK(tp_tensor_empty_on(cpu, TP_F32, 1, bad_shape, &h, &err) != TP_OK);
    tp_error_unref(err);
}

// Host -> device -> host keeps every value; CPU ops refuse device tensors;
// a row slice (contiguous view) on the device copies back alone.
static void
round_trip(void)
{
    need_cuda();
    tp_tensor *h, *d, *back;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_arange(TP_F32, 0, 1000, 1, &h, &err), err);
    TP_CHECK_OK(tp_tensor_to_device(h, gpu0, &d, &err), err);
    TP_CHECK_EQ(tp_tensor_device(d).type, TP_DEVICE_CUDA);
    double v;
    TP_CHECK_EQ(tp_tensor_item(d, 0, &v), TP_EINVAL);
    tp_tensor *c;
    TP_CHECK_EQ(tp_tensor_clone(d, &c, &err), TP_ENOTSUP);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "cuda:0");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_OK(tp_tensor_to_device(d, cpu, &back, &err), err);
    for (int64_t i = 0; i < 1000; i++) {
        TP_CHECK_OK(tp_tensor_item(back, i, &v), NULL);
        TP_CHECK(v == (double)i);
    }
    tp_tensor *slice, *sback;
    TP_CHECK_OK(tp_tensor_narrow(d, 0, 100, 10, &slice, &err), err);
    TP_CHECK_OK(tp_tensor_to_device(slice, cpu, &sback, &err), err);
    TP_CHECK_OK(tp_tensor_item(sback, 0, &v), NULL);
    TP_CHECK(v == 100.0);
    tp_tensor_unref(sback);
    tp_tensor_unref(slice);
    tp_tensor_unref(back);
    tp_tensor_unref(d);
    tp_tensor_unref(h);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(unavailable_is_explained),
    TP_TEST_CASE(same_device_is_a_reference),
    TP_TEST_CASE(round_trip),
};

TP_TEST_MAIN(cases)
