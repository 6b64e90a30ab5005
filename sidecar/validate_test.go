package sidecar

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

func TestCheckProbe(t *testing.T) {
	entry := func(s csi.VolumeHealthErrorType, reason string) *csi.VolumeHealth_VolumeHealthEntry {
		return &csi.VolumeHealth_VolumeHealthEntry{Status: s, Reason: reason, Message: "m"}
	}
	tests := map[string]struct {
		resp *healerv1alpha1.ProbeVolumeResponse
		ok   bool
	}{
		"healthy": {resp: &healerv1alpha1.ProbeVolumeResponse{Healable: true}, ok: true},
		"two conditions": {resp: &healerv1alpha1.ProbeVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			entry(csi.VolumeHealthErrorType_INACCESSIBLE, "MountGone"), entry(csi.VolumeHealthErrorType_DEGRADED, "ReadOnlyMount"),
		}}, ok: true},
		"a status from a later CSI version passes": {resp: &healerv1alpha1.ProbeVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			entry(csi.VolumeHealthErrorType(42), "NewCondition"),
		}}, ok: true},
		"a reason that is not CamelCase passes": {resp: &healerv1alpha1.ProbeVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			entry(csi.VolumeHealthErrorType_DEGRADED, "read only"),
		}}, ok: true},
		"recheck later": {resp: &healerv1alpha1.ProbeVolumeResponse{RecheckAfter: durationpb.New(time.Minute)}, ok: true},
		"status UNKNOWN": {resp: &healerv1alpha1.ProbeVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			entry(csi.VolumeHealthErrorType_UNKNOWN_VOLUME_HEALTH_TYPE, "Whatever"),
		}}},
		"empty reason": {resp: &healerv1alpha1.ProbeVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			entry(csi.VolumeHealthErrorType_INACCESSIBLE, ""),
		}}},
		"repeated condition": {resp: &healerv1alpha1.ProbeVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			entry(csi.VolumeHealthErrorType_INACCESSIBLE, "MountGone"), entry(csi.VolumeHealthErrorType_INACCESSIBLE, "MountGone"),
		}}},
		"zero recheck_after":     {resp: &healerv1alpha1.ProbeVolumeResponse{RecheckAfter: durationpb.New(0)}},
		"negative recheck_after": {resp: &healerv1alpha1.ProbeVolumeResponse{RecheckAfter: durationpb.New(-time.Second)}},
		"invalid recheck_after":  {resp: &healerv1alpha1.ProbeVolumeResponse{RecheckAfter: &durationpb.Duration{Seconds: 1, Nanos: -1}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := checkProbe(tc.resp)
			if tc.ok != (err == nil) {
				t.Fatalf("checkProbe: %v, want ok=%v", err, tc.ok)
			}
			if err != nil && (!errors.Is(err, ErrMalformedResponse) || status.Code(toStatus(err)) != codes.Internal) {
				t.Errorf("error %v is not a malformed response answered INTERNAL", err)
			}
		})
	}
}

func TestCheckList(t *testing.T) {
	ok := &healerv1alpha1.ListStagedVolumesResponse{Entries: []*healerv1alpha1.ListStagedVolumesResponse_Entry{{VolumeId: "a"}}}
	if err := checkList(ok); err != nil {
		t.Errorf("checkList(valid) = %v", err)
	}
	bad := &healerv1alpha1.ListStagedVolumesResponse{Entries: []*healerv1alpha1.ListStagedVolumesResponse_Entry{{VolumeId: "a"}, {}}}
	if err := checkList(bad); !errors.Is(err, ErrMalformedResponse) {
		t.Errorf("checkList(entry without volume_id) = %v, want ErrMalformedResponse", err)
	}
}

func TestToStatus(t *testing.T) {
	tests := map[string]struct {
		err  error
		want codes.Code
	}{
		"empty pv name":          {err: fmt.Errorf("%w: pv_name is required", ErrInvalidRequest), want: codes.InvalidArgument},
		"unknown PV":             {err: fmt.Errorf("%w: x", ErrPVNotFound), want: codes.NotFound},
		"not CSI":                {err: ErrNotCSIVolume, want: codes.InvalidArgument},
		"another driver":         {err: ErrOtherDriver, want: codes.InvalidArgument},
		"secret missing":         {err: fmt.Errorf("pv x: %w", ErrSecretNotFound), want: codes.Unavailable},
		"secrets not readable":   {err: ErrSecretsUnavailable, want: codes.Unavailable},
		"not ready":              {err: ErrNotReady, want: codes.Unavailable},
		"not advertised":         {err: ErrNotAdvertised, want: codes.Unimplemented},
		"malformed response":     {err: ErrMalformedResponse, want: codes.Internal},
		"unexpected":             {err: errors.New("boom"), want: codes.Internal},
		"status kept as it is":   {err: status.Error(codes.Aborted, "busy"), want: codes.Aborted},
		"wrapped status kept":    {err: fmt.Errorf("load: %w", status.Error(codes.Unavailable, "down")), want: codes.Unavailable},
		"not ready over a cause": {err: fmt.Errorf("%w: %w", ErrNotReady, status.Error(codes.Unimplemented, "x")), want: codes.Unavailable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := status.Code(toStatus(tc.err)); got != tc.want {
				t.Errorf("toStatus(%v) = %s, want %s", tc.err, got, tc.want)
			}
		})
	}
}
