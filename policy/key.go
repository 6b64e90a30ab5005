package policy

import (
	"encoding/binary"
	"slices"
	"time"
)

// The memo key of an input is the concatenation, for every path of the plan, of an encoding of
// the value found at that path, read straight from the Go structs. The encoding is injective and
// self-delimiting per type, so equal keys mean equal values at every path, and therefore equal
// Rego values as astValue builds them (nil and empty maps and lists encode alike because astValue
// renders both as empty). It is not meant to be decoded.

const (
	tagAbsent = '-' // the path does not exist in this input (undefined in Rego)
	tagFalse  = 'f'
	tagTrue   = 't'
	tagString = 's'
	tagInt    = 'i'
	tagTime   = 'T'
	tagObject = 'o' // a struct, its fields in a fixed order
	tagMap    = 'm' // a map, keys sorted
	tagList   = 'l'
)

// appendKey appends the memo key of in to b.
func (p *keyPlan) appendKey(b []byte, in *Input) []byte {
	for _, path := range p.paths {
		b = appendInput(b, in, path)
	}
	return b
}

// step splits a path into its first element and the rest. whole is true when the path selects
// the value itself (empty) or iterates over it, in which case the value is encoded whole: a
// finer key than necessary, never a coarser one.
func step(p inputPath) (e pathElem, rest inputPath, whole bool) {
	if len(p) == 0 || p[0].kind == elemAny {
		return pathElem{}, nil, true
	}
	return p[0], p[1:], false
}

func absent(b []byte) []byte { return append(b, tagAbsent) }

func appendInput(b []byte, in *Input, p inputPath) []byte {
	e, rest, whole := step(p)
	if whole {
		b = append(b, tagObject)
		for _, f := range []string{"trigger", "volume", "attachment", "node", "driver", "history", "probe", "remedies"} {
			b = appendInput(b, in, inputPath{{kind: elemKey, key: f}})
		}
		return b
	}
	if e.kind != elemKey {
		return absent(b)
	}
	switch e.key {
	case "trigger":
		return appendString(b, string(in.Trigger), rest)
	case "volume":
		return appendVolume(b, &in.Volume, rest)
	case "attachment":
		if in.Attachment == nil {
			return absent(b)
		}
		return appendAttachment(b, in.Attachment, rest)
	case "node":
		if in.Node == nil {
			return absent(b)
		}
		return appendNode(b, in.Node, rest)
	case "driver":
		return appendDriver(b, &in.Driver, rest)
	case "history":
		return appendHistory(b, &in.History, rest)
	case "probe":
		if in.Probe == nil {
			return absent(b)
		}
		return appendProbe(b, in.Probe, rest)
	case "remedies":
		return appendRemedies(b, &in.Remedies, rest)
	}
	return absent(b)
}

// field is the common shape of the struct encoders: given the remaining path, encode the field
// named by its first element.
func appendStruct(b []byte, p inputPath, fields []string, field func(b []byte, name string, rest inputPath) ([]byte, bool)) []byte {
	e, rest, whole := step(p)
	if whole {
		b = append(b, tagObject)
		for _, f := range fields {
			b, _ = field(b, f, nil)
		}
		return b
	}
	if e.kind != elemKey {
		return absent(b)
	}
	b, ok := field(b, e.key, rest)
	if !ok {
		return absent(b)
	}
	return b
}

var volumeFields = []string{"pv", "handle", "driver", "attributes", "mountOptions", "accessModes", "storageClass", "pvc"}

func appendVolume(b []byte, v *Volume, p inputPath) []byte {
	return appendStruct(b, p, volumeFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "pv":
			return appendString(b, v.PV, rest), true
		case "handle":
			return appendString(b, v.Handle, rest), true
		case "driver":
			return appendString(b, v.Driver, rest), true
		case "attributes":
			return appendStringMap(b, v.Attributes, rest), true
		case "mountOptions":
			return appendStrings(b, v.MountOptions, rest), true
		case "accessModes":
			return appendStrings(b, v.AccessModes, rest), true
		case "storageClass":
			if v.StorageClass == nil {
				return absent(b), true
			}
			return appendStorageClass(b, v.StorageClass, rest), true
		case "pvc":
			if v.PVC == nil {
				return absent(b), true
			}
			return appendClaim(b, v.PVC, rest), true
		}
		return b, false
	})
}

var storageClassFields = []string{"name", "parameters"}

func appendStorageClass(b []byte, sc *StorageClass, p inputPath) []byte {
	return appendStruct(b, p, storageClassFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "name":
			return appendString(b, sc.Name, rest), true
		case "parameters":
			return appendStringMap(b, sc.Parameters, rest), true
		}
		return b, false
	})
}

var claimFields = []string{"namespace", "name", "labels", "annotations"}

func appendClaim(b []byte, c *Claim, p inputPath) []byte {
	return appendStruct(b, p, claimFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "namespace":
			return appendString(b, c.Namespace, rest), true
		case "name":
			return appendString(b, c.Name, rest), true
		case "labels":
			return appendStringMap(b, c.Labels, rest), true
		case "annotations":
			return appendStringMap(b, c.Annotations, rest), true
		}
		return b, false
	})
}

var attachmentFields = []string{"node", "attached", "detaching"}

func appendAttachment(b []byte, a *Attachment, p inputPath) []byte {
	return appendStruct(b, p, attachmentFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "node":
			return appendString(b, a.Node, rest), true
		case "attached":
			return appendBool(b, a.Attached, rest), true
		case "detaching":
			return appendBool(b, a.Detaching, rest), true
		}
		return b, false
	})
}

var nodeFields = []string{"name", "labels"}

func appendNode(b []byte, n *Node, p inputPath) []byte {
	return appendStruct(b, p, nodeFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "name":
			return appendString(b, n.Name, rest), true
		case "labels":
			return appendStringMap(b, n.Labels, rest), true
		}
		return b, false
	})
}

var driverFields = []string{"name", "identityCapabilities", "healer", "tier", "probeSource"}

func appendDriver(b []byte, d *DriverInfo, p inputPath) []byte {
	return appendStruct(b, p, driverFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "name":
			return appendString(b, d.Name, rest), true
		case "identityCapabilities":
			return appendStrings(b, d.IdentityCapabilities, rest), true
		case "healer":
			return appendHealer(b, &d.Healer, rest), true
		case "tier":
			return appendString(b, d.Tier, rest), true
		case "probeSource":
			return appendString(b, d.ProbeSource, rest), true
		}
		return b, false
	})
}

var healerFields = []string{"probe", "heal", "listVolumes", "attributes", "volumeKeeping"}

func appendHealer(b []byte, h *HealerCapabilities, p inputPath) []byte {
	return appendStruct(b, p, healerFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "probe":
			return appendBool(b, h.Probe, rest), true
		case "heal":
			return appendBool(b, h.Heal, rest), true
		case "listVolumes":
			return appendBool(b, h.ListVolumes, rest), true
		case "attributes":
			return appendStringMap(b, h.Attributes, rest), true
		case "volumeKeeping":
			return appendVolumeKeeping(b, &h.VolumeKeeping, rest), true
		}
		return b, false
	})
}

var volumeKeepingFields = []string{"pluginRestart", "mounterRestart"}

func appendVolumeKeeping(b []byte, k *VolumeKeeping, p inputPath) []byte {
	return appendStruct(b, p, volumeKeepingFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "pluginRestart":
			return appendBool(b, k.PluginRestart, rest), true
		case "mounterRestart":
			return appendBool(b, k.MounterRestart, rest), true
		}
		return b, false
	})
}

var remediesFields = []string{"heal", "restartContainers", "evict"}

func appendRemedies(b []byte, r *Remedies, p inputPath) []byte {
	return appendStruct(b, p, remediesFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "heal":
			return appendBool(b, r.Heal, rest), true
		case "restartContainers":
			return appendBool(b, r.RestartContainers, rest), true
		case "evict":
			return appendBool(b, r.Evict, rest), true
		}
		return b, false
	})
}

var historyFields = []string{"lastProbe", "consecutiveFailures", "lastHeal"}

func appendHistory(b []byte, h *History, p inputPath) []byte {
	return appendStruct(b, p, historyFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "lastProbe":
			if h.LastProbe == nil {
				return absent(b), true
			}
			return appendProbeRecord(b, h.LastProbe, rest), true
		case "consecutiveFailures":
			return appendInt(b, int64(h.ConsecutiveFailures), rest), true
		case "lastHeal":
			if h.LastHeal == nil {
				return absent(b), true
			}
			return appendTime(b, *h.LastHeal, rest), true
		}
		return b, false
	})
}

var probeRecordFields = []string{"time", "healthy", "health"}

func appendProbeRecord(b []byte, r *ProbeRecord, p inputPath) []byte {
	return appendStruct(b, p, probeRecordFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "time":
			return appendTime(b, r.Time, rest), true
		case "healthy":
			return appendBool(b, r.Healthy, rest), true
		case "health":
			return appendHealthList(b, r.Health, rest), true
		}
		return b, false
	})
}

var probeFields = []string{"healthy", "health", "healable", "recheckAfterSeconds", "kept"}

func appendProbe(b []byte, r *ProbeResult, p inputPath) []byte {
	return appendStruct(b, p, probeFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "healthy":
			return appendBool(b, r.Healthy, rest), true
		case "health":
			return appendHealthList(b, r.Health, rest), true
		case "healable":
			return appendBool(b, r.Healable, rest), true
		case "recheckAfterSeconds":
			return appendInt(b, r.RecheckAfterSeconds, rest), true
		case "kept":
			return appendBool(b, r.Kept, rest), true
		}
		return b, false
	})
}

var healthFields = []string{"status", "reason", "message"}

func appendHealth(b []byte, h *Health, p inputPath) []byte {
	return appendStruct(b, p, healthFields, func(b []byte, name string, rest inputPath) ([]byte, bool) {
		switch name {
		case "status":
			return appendString(b, string(h.Status), rest), true
		case "reason":
			return appendString(b, h.Reason, rest), true
		case "message":
			return appendString(b, h.Message, rest), true
		}
		return b, false
	})
}

// appendHealthList supports iteration below the list (probe.health[_].status): every element is
// encoded at the rest of the path, so a policy that only looks at statuses shares decisions
// between volumes whose messages differ.
func appendHealthList(b []byte, hs []Health, p inputPath) []byte {
	if len(p) == 0 {
		p = inputPath{{kind: elemAny}}
	}
	switch p[0].kind {
	case elemAny:
		b = append(b, tagList)
		b = binary.AppendUvarint(b, uint64(len(hs)))
		for i := range hs {
			b = appendHealth(b, &hs[i], p[1:])
		}
		return b
	case elemIndex:
		if p[0].index < len(hs) {
			return appendHealth(b, &hs[p[0].index], p[1:])
		}
	}
	return absent(b)
}

func appendString(b []byte, s string, rest inputPath) []byte {
	if len(rest) > 0 {
		return absent(b) // strings have no members
	}
	b = append(b, tagString)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, v bool, rest inputPath) []byte {
	switch {
	case len(rest) > 0:
		return absent(b)
	case v:
		return append(b, tagTrue)
	default:
		return append(b, tagFalse)
	}
}

func appendInt(b []byte, v int64, rest inputPath) []byte {
	if len(rest) > 0 {
		return absent(b)
	}
	return binary.AppendVarint(append(b, tagInt), v)
}

// appendTime encodes the instant, which is what formatTime renders.
func appendTime(b []byte, t time.Time, rest inputPath) []byte {
	if len(rest) > 0 {
		return absent(b)
	}
	b = binary.AppendVarint(append(b, tagTime), t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

func appendStrings(b []byte, s []string, p inputPath) []byte {
	if len(p) > 0 && p[0].kind != elemAny {
		if p[0].kind == elemIndex && p[0].index < len(s) {
			return appendString(b, s[p[0].index], p[1:])
		}
		return absent(b)
	}
	b = append(b, tagList)
	b = binary.AppendUvarint(b, uint64(len(s)))
	for _, x := range s {
		b = appendString(b, x, nil)
	}
	return b
}

func appendStringMap(b []byte, m map[string]string, p inputPath) []byte {
	if len(p) > 0 && p[0].kind != elemAny {
		if p[0].kind != elemKey {
			return absent(b)
		}
		v, ok := m[p[0].key]
		if !ok {
			return absent(b)
		}
		return appendString(b, v, p[1:])
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, tagMap)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendString(b, k, nil)
		b = appendString(b, m[k], nil)
	}
	return b
}
