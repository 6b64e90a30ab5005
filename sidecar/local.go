package sidecar

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// The sidecar's own answers for a driver that serves no Healer service, or not all of it: it
// probes volumes and lists them from kubelet's records on its node (package nodeprobe). Healing
// only the driver can do.

// capabilitiesFor is the NodeHealer capabilities answer for the driver: the driver's own, plus
// PROBE and LIST_VOLUMES where the sidecar serves them itself, and container_restart while the
// container runtime it was given answers.
func (h *nodeHealer) capabilitiesFor(info *driverInfo) *healerv1alpha1.NodeGetHealerCapabilitiesResponse {
	resp := &healerv1alpha1.NodeGetHealerCapabilitiesResponse{
		DriverName:    info.name,
		VendorVersion: info.vendorVersion,
		NodeName:      h.nodeName,
		ProbeSource:   healerv1alpha1.ProbeSource_PROBE_SOURCE_DRIVER,
	}
	if h.runtime != nil {
		resp.ContainerRestart, _ = h.runtime.Reachable()
	}
	if !info.healerUnimplemented {
		resp.Capabilities = slices.Clone(info.capabilities)
		resp.Attributes = info.attributes
	}
	if !info.serves(healerv1alpha1.HealerCapability_RPC_PROBE) {
		resp.Capabilities = append(resp.Capabilities, healerv1alpha1.NewRPCCapability(healerv1alpha1.HealerCapability_RPC_PROBE))
		resp.ProbeSource = healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR
	}
	if !info.serves(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		resp.Capabilities = append(resp.Capabilities, healerv1alpha1.NewRPCCapability(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES))
	}
	return resp
}

// probeLocally probes the volume of the PV the request names on this node itself, for a driver
// that does not advertise PROBE. It reads no Secret: nothing it does needs one.
func (h *nodeHealer) probeLocally(ctx context.Context, info *driverInfo, req *healerv1alpha1.NodeProbeVolumeRequest) (*healerv1alpha1.NodeProbeVolumeResponse, error) {
	pvName := req.GetPvName()
	if pvName == "" {
		return nil, toStatus(fmt.Errorf("%w: pv_name is required", ErrInvalidRequest))
	}
	vol, err := h.volumeFor(ctx, info, pvName, req.GetVolume())
	if err != nil {
		return nil, toStatus(err)
	}
	if err := h.onNode(ctx, info, vol, healerv1alpha1.HealerCapability_RPC_PROBE); err != nil {
		return nil, toStatus(err)
	}
	log := klog.FromContext(ctx).WithValues("volume", vol.volumeID)
	readOnly := vol.readOnly || vol.capability.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	_, findings, err := h.local.Probe(ctx, nodeprobe.Request{Driver: info.name, Handle: vol.volumeID, PV: pvName, ReadOnly: readOnly, Block: vol.block})
	switch {
	case errors.Is(err, nodeprobe.ErrNotOnNode):
		return nil, toStatus(fmt.Errorf("%w: %w", ErrNotOnNode, err))
	case errors.Is(err, nodeprobe.ErrNotProbed):
		// Said as UNIMPLEMENTED: the controller records the volume as not probed, not healthy.
		return nil, status.Errorf(codes.Unimplemented, "not probed: the driver %q does not probe volumes (it advertises no PROBE), and the sidecar cannot: %v", info.name, err)
	case errors.Is(err, nodeprobe.ErrBadRecord):
		return nil, status.Errorf(codes.FailedPrecondition, "PersistentVolume %q on node %q: %v", pvName, h.nodeName, err)
	case errors.Is(err, nodeprobe.ErrStatBusy):
		return nil, status.Errorf(codes.Aborted, "PersistentVolume %q: %v", pvName, err)
	case err != nil:
		return nil, status.Errorf(codes.Internal, "probe of PersistentVolume %q on node %q by the sidecar: %v", pvName, h.nodeName, err)
	}
	health := driverkit.Health(findings)
	log.V(4).Info("Probed by the sidecar", "health", len(health))
	return &healerv1alpha1.NodeProbeVolumeResponse{
		HealthStatuses: health,
		VolumeId:       vol.volumeID,
		ProbeSource:    healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR,
	}, nil
}

// recordedHere reports whether kubelet's records on this node show vol staged or published here.
func (h *nodeHealer) recordedHere(driverName string, vol *volume) bool {
	_, err := h.records(driverName, vol)
	return err == nil
}

// records returns what kubelet's records on this node show of vol: its filesystem layout, or
// for a raw block volume its volumeDevices layout. They are read now.
func (h *nodeHealer) records(driverName string, vol *volume) (*nodeprobe.Volume, error) {
	return h.findRecords(driverName, vol, false)
}

// findRecords is records; with recent set, the pods a filesystem volume is published for may be
// looked up in the read of the pods' folders made up to publishTargetsMaxAge ago (h.podVolumes).
func (h *nodeHealer) findRecords(driverName string, vol *volume, recent bool) (*nodeprobe.Volume, error) {
	if h.local == nil {
		return nil, fmt.Errorf("%w: the sidecar reads no kubelet records", nodeprobe.ErrNotOnNode)
	}
	r := h.local.Records()
	if vol.block {
		return r.FindBlock(driverName, vol.volumeID, vol.pvName)
	}
	if recent {
		r.Pods = h.podVolumes
	}
	return r.Find(driverName, vol.volumeID, vol.pvName)
}

// publishTargetsMaxAge is how old the read of the pods' folders may be that a probe's publish
// target paths come from (nodeprobe.PodVolumes): a sweep probes a node's volumes tens a second,
// and each read of the folders looks into every pod on the node. A pod published in the last
// second may be missing from a probe's paths, which are optional (the driver then goes by its own
// records); a heal's are read at the call.
const publishTargetsMaxAge = time.Second

// publishTargets returns the paths kubelet's records on this node show vol published at, for the
// driver's ProbeVolume and HealVolume (publish_target_paths): for a heal as read now, for a
// probe from a read of the pods' folders at most publishTargetsMaxAge old. It returns none when
// kubelet records none, or when its records cannot be read (logged): the field is optional, and
// the driver then goes by its own records.
func (h *nodeHealer) publishTargets(ctx context.Context, driverName string, vol *volume, rpc healerv1alpha1.HealerCapability_RPC_Type) []string {
	rec, err := h.findRecords(driverName, vol, rpc != healerv1alpha1.HealerCapability_RPC_HEAL && h.podVolumes != nil)
	switch {
	case errors.Is(err, nodeprobe.ErrNotOnNode):
		return nil
	case err != nil:
		klog.FromContext(ctx).V(2).Info("Cannot read kubelet's records of the volume; sending the driver no publish target paths", "error", err.Error())
		return nil
	}
	return rec.Targets
}

// localTokenPrefix marks the paging tokens of the sidecar's own list.
const localTokenPrefix = "kubelet:"

// listLocally answers one page of ListStagedVolumes from kubelet's records on this node, for a
// driver that does not list its volumes itself: the volumes it staged, and those it published
// without staging (a driver without STAGE_UNSTAGE_VOLUME), sorted by volume ID. The paging token
// is the last volume ID of the page before.
func (h *nodeHealer) listLocally(ctx context.Context, info *driverInfo, req *healerv1alpha1.NodeListStagedVolumesRequest) (*healerv1alpha1.NodeListStagedVolumesResponse, error) {
	after := ""
	if token := req.GetStartingToken(); token != "" {
		enc, ok := strings.CutPrefix(token, localTokenPrefix)
		b, err := base64.RawURLEncoding.DecodeString(enc)
		if !ok || err != nil || len(b) == 0 {
			return nil, status.Errorf(codes.Aborted, "starting_token %q is not one this sidecar gave; start again with an empty token", token)
		}
		after = string(b)
	}
	vols, err := h.local.List(info.name)
	if err != nil {
		// A record that cannot be read does not hide the others.
		klog.FromContext(ctx).Error(err, "Some of kubelet's volume records cannot be read; listing the others", "driver", info.name)
	}
	out := &healerv1alpha1.NodeListStagedVolumesResponse{}
	for _, v := range vols {
		if v.Handle <= after {
			continue
		}
		if req.GetMaxEntries() > 0 && len(out.Entries) == int(req.GetMaxEntries()) {
			last := out.Entries[len(out.Entries)-1].GetVolumeId()
			out.NextToken = localTokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(last))
			break
		}
		pv := v.PV
		if pv == "" {
			pv = h.volumes.pvNameFor(info.name, v.Handle)
		}
		out.Entries = append(out.Entries, &healerv1alpha1.NodeListStagedVolumesResponse_Entry{
			PvName: pv, VolumeId: v.Handle, StagingTargetPath: v.StagingPath,
		})
	}
	return out, nil
}
