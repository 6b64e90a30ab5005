package controller

import (
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller/leader"
	"github.com/volume-healer/volume-healer/config"
)

// newLease makes the leader election Lease lock as controller-runtime's manager would (identity
// host name and a UUID, requests bounded by half the renew deadline, Events on the Lease from
// that identity) and wraps it in the leader.Lease that bounds the calls to the sidecars.
func newLease(restCfg *rest.Config, le config.LeaderElection, events record.EventBroadcaster, scheme *runtime.Scheme) (*leader.Lease, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("leader election identity: %w", err)
	}
	id := host + "_" + string(uuid.NewUUID())
	lockCfg := rest.CopyConfig(restCfg)
	lockCfg.UserAgent += "/leader-election"
	// A single hung request must not use up the whole renew deadline.
	lockCfg.Timeout = max(le.RenewDeadline/2, time.Second)
	client, err := kubernetes.NewForConfig(lockCfg)
	if err != nil {
		return nil, err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, le.Namespace, le.LeaseName, client.CoreV1(), client.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id, EventRecorder: events.NewRecorder(scheme, corev1.EventSource{Component: id})})
	if err != nil {
		return nil, fmt.Errorf("leader election Lease %s/%s: %w", le.Namespace, le.LeaseName, err)
	}
	return leader.New(leader.Options{Lock: lock, Margin: le.CallMargin})
}
